package notify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/emersion/go-smtp"
)

// The three ways a send can fail. They decide what the ledger does next.
var (
	// ErrTransient means the email was certainly not accepted and may be
	// sent again: a 4xx reply, or a connection lost before the message was
	// complete.
	ErrTransient = errors.New("transient send failure")
	// ErrPermanent means the server refused the email for good (5xx).
	ErrPermanent = errors.New("permanent send failure")
	// ErrUnknownOutcome means the whole message was handed over but the
	// answer was lost: the server may or may not have accepted it.
	ErrUnknownOutcome = errors.New("send outcome unknown")
)

// Mailer sends one message.
type Mailer interface {
	// Send delivers msg and returns the server's reply text. Errors wrap
	// ErrTransient, ErrPermanent or ErrUnknownOutcome.
	Send(ctx context.Context, from, to string, msg []byte) (reply string, err error)
}

// SMTPMailer sends through an SMTP relay, one connection per message.
type SMTPMailer struct {
	// Addr is host:port of the relay.
	Addr string
	// HeloName is the name given in EHLO.
	HeloName string
	// Timeout bounds a whole send, from dial to the reply after DATA.
	Timeout time.Duration
}

// Send implements Mailer.
func (m *SMTPMailer) Send(ctx context.Context, from, to string, msg []byte) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.Timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", m.Addr)
	if err != nil {
		return "", fmt.Errorf("%w: connect to %s: %v", ErrTransient, m.Addr, err)
	}
	// The deadline of ctx bounds every step: closing the connection
	// unblocks whatever read or write is in progress.
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()

	c := smtp.NewClient(conn)
	defer c.Close()
	c.CommandTimeout, c.SubmissionTimeout = m.Timeout, m.Timeout
	helo := m.HeloName
	if helo == "" {
		helo = "localhost"
	}
	if err := c.Hello(helo); err != nil {
		return "", beforeData("EHLO", err)
	}
	if err := c.Mail(from, nil); err != nil {
		return "", beforeData("MAIL FROM", err)
	}
	if err := c.Rcpt(to, nil); err != nil {
		return "", beforeData("RCPT TO", err)
	}
	w, err := c.Data()
	if err != nil {
		return "", beforeData("DATA", err)
	}
	if _, err := w.Write(msg); err != nil {
		// The terminating dot has not been sent, so the server cannot
		// have accepted a message: safe to retry.
		return "", fmt.Errorf("%w: write message: %v", ErrTransient, err)
	}
	resp, err := w.CloseWithResponse()
	if err != nil {
		var se *smtp.SMTPError
		if errors.As(err, &se) {
			return "", classifyReply("end of DATA", se)
		}
		// The message and its terminating dot went out, and no reply came
		// back. The server may have queued it: only the ledger's policy may
		// decide to send it again.
		return "", fmt.Errorf("%w: no reply after the message was sent: %v", ErrUnknownOutcome, err)
	}
	_ = c.Quit() // the message is accepted; a failed QUIT changes nothing
	return resp.StatusText, nil
}

func beforeData(step string, err error) error {
	var se *smtp.SMTPError
	if errors.As(err, &se) {
		return classifyReply(step, se)
	}
	return fmt.Errorf("%w: %s: %v", ErrTransient, step, err)
}

func classifyReply(step string, se *smtp.SMTPError) error {
	if se.Code >= 500 {
		return fmt.Errorf("%w: %s: %d %s", ErrPermanent, step, se.Code, se.Message)
	}
	return fmt.Errorf("%w: %s: %d %s", ErrTransient, step, se.Code, se.Message)
}
