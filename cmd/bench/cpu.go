package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the unit of the CPU times in /proc (USER_HZ), 100 on
// every Linux this runs on.
const clockTicks = 100

// cpuMeter measures, over one load run, how many cores the whole machine
// and each named process kept busy: the numbers that say whether a
// throughput is limited by the CPU and who spent it.
type cpuMeter struct {
	start       time.Time
	busy, total float64 // machine, in ticks
	procs       map[string]int
	procStart   map[string]float64
}

// startCPU begins a measurement of the machine and of the given processes
// (name to pid).
func startCPU(procs map[string]int) *cpuMeter {
	m := &cpuMeter{start: time.Now(), procs: procs, procStart: map[string]float64{}}
	m.busy, m.total = machineTicks()
	for name, pid := range procs {
		m.procStart[name] = procTicks(pid)
	}
	return m
}

// cores is one measurement's result, in cores kept busy on average.
type cores struct {
	Machine float64
	Procs   map[string]float64
}

func (m *cpuMeter) stop() cores {
	secs := time.Since(m.start).Seconds()
	busy, _ := machineTicks()
	c := cores{Machine: (busy - m.busy) / clockTicks / secs, Procs: map[string]float64{}}
	for name, pid := range m.procs {
		c.Procs[name] = (procTicks(pid) - m.procStart[name]) / clockTicks / secs
	}
	return c
}

func (c cores) String() string {
	var parts []string
	for _, name := range []string{"orders serve", "devbroker", "pgbench"} {
		if v, ok := c.Procs[name]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", name, v))
		}
	}
	s := fmt.Sprintf("machine %.2f cores busy", c.Machine)
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

// machineTicks returns the busy and total CPU ticks of all cores from
// /proc/stat; idle and iowait count as not busy.
func machineTicks() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	return parseProcStat(string(b))
}

func parseProcStat(s string) (busy, total float64) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	var idle float64
	for i, v := range f[1:] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			continue
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return total - idle, total
}

// procTicks returns the user and system CPU ticks a process used so far
// (fields 14 and 15 of /proc/PID/stat), or 0 when it cannot.
func procTicks(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	return parsePidStat(string(b))
}

func parsePidStat(s string) float64 {
	// The command name, in parentheses, may hold spaces: count from after it.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return utime + stime
}
