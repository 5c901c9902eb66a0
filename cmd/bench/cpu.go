package main

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the unit of the CPU times in /proc (USER_HZ), 100 on
// every Linux this runs on.
const clockTicks = 100

// cpuMeter measures, over one load run, how many cores the whole machine
// and each named process kept busy: the numbers that say whether a
// throughput is limited by the CPU and who spent it. With a run id it also
// sums PostgreSQL's processes in two groups: the backends serving the
// run's databases, and the server's own background processes (shared with
// anyone else using the server).
type cpuMeter struct {
	start     time.Time
	machine   machineStat
	procs     map[string]int
	procStart map[string]float64
	runID     string
	pgStart   map[int]float64
	result    *cores // once stopped
}

// The groups of PostgreSQL processes a cpuMeter reports.
const (
	pgBackends   = "postgres (this run's backends)"
	pgBackground = "postgres (background, shared)"
)

// startCPU begins a measurement of the machine and of the given processes
// (name to pid), and of PostgreSQL's when runID is not empty.
func startCPU(procs map[string]int, runID string) *cpuMeter {
	m := &cpuMeter{start: time.Now(), procs: procs, procStart: map[string]float64{}, runID: runID}
	m.machine = readMachineStat()
	for name, pid := range procs {
		m.procStart[name] = procTicks(pid)
	}
	if runID != "" {
		m.pgStart = map[int]float64{}
		for pid, p := range postgresProcs(runID) {
			m.pgStart[pid] = p.ticks
		}
	}
	return m
}

// cores is one measurement's result, in cores kept busy on average.
// Kernel is the part of Machine spent in the kernel (system time and
// interrupts), and Switches the machine's context switches per second:
// every hop of an event from one process to the next wakes the next one
// up, and on a virtual machine each wake-up is dear.
type cores struct {
	Machine  float64
	Kernel   float64
	Switches float64
	Procs    map[string]float64
}

// perEvent returns the CPU (in ms) and the context switches each event
// cost the whole machine at rate events per second.
func (c cores) perEvent(rate float64) (cpuMS, switches float64) {
	if rate <= 0 {
		return 0, 0
	}
	return 1000 * c.Machine / rate, c.Switches / rate
}

// add starts measuring one more process, from now.
func (m *cpuMeter) add(name string, pid int) {
	m.procs[name] = pid
	m.procStart[name] = procTicks(pid)
}

// stop ends the measurement and returns it; later calls return the same.
func (m *cpuMeter) stop() cores {
	if m.result != nil {
		return *m.result
	}
	secs := time.Since(m.start).Seconds()
	end := readMachineStat()
	c := cores{Machine: (end.busy - m.machine.busy) / clockTicks / secs, Kernel: (end.kernel - m.machine.kernel) / clockTicks / secs,
		Switches: (end.switches - m.machine.switches) / secs, Procs: map[string]float64{}}
	for name, pid := range m.procs {
		c.Procs[name] = (procTicks(pid) - m.procStart[name]) / clockTicks / secs
	}
	if m.pgStart != nil {
		sums := map[string]float64{}
		for pid, p := range postgresProcs(m.runID) {
			// A process started during the run spent all its ticks in it.
			sums[p.group] += p.ticks - m.pgStart[pid]
		}
		for _, g := range []string{pgBackends, pgBackground} {
			c.Procs[g] = sums[g] / clockTicks / secs
		}
	}
	m.result = &c
	return c
}

func (c cores) String() string {
	names := make([]string, 0, len(c.Procs))
	for name := range c.Procs {
		names = append(names, name)
	}
	sort.Strings(names)
	var parts []string
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s %.2f", name, c.Procs[name]))
	}
	s := fmt.Sprintf("machine %.2f cores busy, %.2f in the kernel, %s context switches/s", c.Machine, c.Kernel, groupThousands(fmt.Sprintf("%.0f", c.Switches)))
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

// pgProc is one PostgreSQL process: its group and CPU ticks so far.
type pgProc struct {
	group string
	ticks float64
}

// postgresProcs lists the PostgreSQL server processes on this host that
// belong to one of the cpuMeter's groups, by pid.
func postgresProcs(runID string) map[int]pgProc {
	out := map[int]pgProc{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		if g := postgresGroup(string(cmdline), runID); g != "" {
			out[pid] = pgProc{group: g, ticks: procTicks(pid)}
		}
	}
	return out
}

// postgresGroup classifies a PostgreSQL process by its command line (the
// server rewrites it to "postgres: [cluster: ]user database host state" for
// a backend and "postgres: [cluster: ]checkpointer" and the like for its
// own processes): a backend or autovacuum worker on one of the run's
// databases (named bench_<runID>_...), a background process, or "" for
// anyone else's backend.
func postgresGroup(cmdline, runID string) string {
	if strings.Contains(cmdline, "bench_"+runID+"_") {
		return pgBackends
	}
	if !strings.HasPrefix(cmdline, "postgres:") {
		return pgBackground // the postmaster, started as .../bin/postgres -D ...
	}
	for _, bg := range []string{"checkpointer", "background writer", "walwriter", "autovacuum launcher", "logical replication launcher", "archiver", "stats collector"} {
		if strings.HasSuffix(strings.TrimRight(cmdline, "\x00 "), bg) {
			return pgBackground
		}
	}
	return ""
}

// machineStat is the whole machine's CPU time (in ticks, all cores) and
// context switches since boot.
type machineStat struct {
	busy, total float64 // idle and iowait count as not busy
	kernel      float64 // system, irq and softirq: part of busy
	switches    float64
}

// readMachineStat reads the machine's counters from /proc/stat.
func readMachineStat() machineStat {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineStat{}
	}
	return parseProcStat(string(b))
}

func parseProcStat(s string) machineStat {
	var m machineStat
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "ctxt" {
			m.switches, _ = strconv.ParseFloat(f[1], 64)
		}
		if len(f) < 5 || f[0] != "cpu" {
			continue
		}
		var idle float64
		for i, v := range f[1:] {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				continue
			}
			m.total += n
			switch i {
			case 3, 4: // idle, iowait
				idle += n
			case 2, 5, 6: // system, irq, softirq
				m.kernel += n
			}
		}
		m.busy = m.total - idle
	}
	return m
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
