package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one service process the benchmark started.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
	idleRSS float64 // MiB, read once the process was ready
	stopped bool
}

// startProc runs bin with args and env (added to a minimal environment),
// its output going to a log file in dir.
func startProc(dir, name, bin string, env map[string]string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = baseEnv()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// A group of its own: a Ctrl-C reaches the benchmark, which stops the
	// services in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// runCmd runs a short command to completion (a migration), returning its
// output with the error.
func runCmd(ctx context.Context, bin string, env map[string]string, args ...string) error {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LOG_LEVEL=warn"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// failure describes an unexpected exit with the end of the log.
func (p *proc) failure() error {
	return fmt.Errorf("%s exited (%v); end of its log:\n%s", p.name, p.err, tail(p.logPath, 20))
}

// check returns an error when the process has exited.
func (p *proc) check() error {
	if p.exited() {
		return p.failure()
	}
	return nil
}

// waitHTTP waits until url answers 200, the process exits or ctx ends.
func (p *proc) waitHTTP(ctx context.Context, url string) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if err := p.check(); err != nil {
			return err
		}
		res, err := client.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				p.idleRSS = readStatusMiB(p.cmd.Process.Pid, "VmRSS")
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not become ready at %s; end of its log:\n%s", p.name, url, tail(p.logPath, 20))
}

// waitPort waits until addr accepts connections.
func (p *proc) waitPort(ctx context.Context, addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if err := p.check(); err != nil {
			return err
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			p.idleRSS = readStatusMiB(p.cmd.Process.Pid, "VmRSS")
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not listen on %s", p.name, addr)
}

// stop reads the peak resident set (VmHWM) and then stops the process with
// SIGTERM, or SIGKILL after the grace period. It returns the peak in MiB.
func (p *proc) stop(grace time.Duration) (peakMiB float64, err error) {
	if p.stopped {
		return 0, nil
	}
	p.stopped = true
	if p.exited() {
		return 0, p.failure()
	}
	peakMiB = readStatusMiB(p.cmd.Process.Pid, "VmHWM")
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return peakMiB, fmt.Errorf("%s did not stop within %s; killed", p.name, grace)
	}
	return peakMiB, nil
}

// readStatusMiB reads a kB field (VmHWM, VmRSS) of /proc/PID/status in MiB,
// or 0 when it cannot.
func readStatusMiB(pid int, field string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	return parseStatusField(bufio.NewScanner(f), field)
}

func parseStatusField(sc *bufio.Scanner, field string) float64 {
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, field+":") {
			continue
		}
		fs := strings.Fields(strings.TrimPrefix(line, field+":"))
		if len(fs) == 0 {
			return 0
		}
		kb, err := strconv.ParseFloat(fs[0], 64)
		if err != nil {
			return 0
		}
		return kb / 1024
	}
	return 0
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freeAddr returns a 127.0.0.1 address with a port nothing listens on.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

var errTimeout = errors.New("timed out")

// baseEnv is the environment every started process begins with: a quiet
// log, and the Go runtime's memory, collector and processor settings when the
// benchmark itself was given them, to try them on the services.
func baseEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LOG_LEVEL=warn"}
	for _, k := range []string{"GOMEMLIMIT", "GOGC", "GOMAXPROCS"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// pid is the process id of a started service.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// selfPID is the benchmark's own process id: the load generator and the
// SMTP sink run in it.
func selfPID() int { return os.Getpid() }
