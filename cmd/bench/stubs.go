package main

import (
	"context"
	"errors"
)

func (b *bench) recoveryScenario(ctx context.Context) error { return errors.New("not yet") }
