package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
)

// serveCluster is three `jobbus serve` processes forming one cluster on loopback.
type serveCluster struct {
	t     *testing.T
	dirs  []string
	urls  []string
	args  [][]string
	procs []*proc
}

func startServeCluster(t *testing.T, extra ...string) *serveCluster {
	t.Helper()
	ports := freePorts(t, 6)
	sc := &serveCluster{t: t}
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3+i]))
	}
	for i := range 3 {
		dir := filepath.Join(t.TempDir(), "node"+strconv.Itoa(i))
		sc.dirs = append(sc.dirs, dir)
		sc.urls = append(sc.urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
		sc.args = append(sc.args, append([]string{"serve", "--data-dir", dir,
			"--nats-listen", fmt.Sprintf("127.0.0.1:%d", ports[i]),
			"--cluster-listen", fmt.Sprintf("127.0.0.1:%d", ports[3+i]), "--routes", strings.Join(routes, ","),
			"--server-name", "n" + strconv.Itoa(i),
			"--worker-port", "-1", "--client-port", "-1", "--http-listen", "-", "--workers", "1"}, extra...))
	}
	for i := range 3 {
		sc.procs = append(sc.procs, startProc(t, nil, sc.args[i]...))
	}
	return sc
}

// restart starts node i again on its store and ports.
func (sc *serveCluster) restart(i int) {
	sc.procs[i] = startProc(sc.t, nil, sc.args[i]...)
}

// dial connects to node i, waiting for it.
func (sc *serveCluster) dial(i int) *nats.Conn {
	sc.t.Helper()
	nc, err := nats.Connect(sc.urls[i], nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		sc.t.Fatal(err)
	}
	sc.t.Cleanup(nc.Close)
	return nc
}

// healthy waits until want coordinators answer (one leading), every server answers
// and every bucket has 3 current replicas; it returns the status seen.
func healthy(t *testing.T, nc *nats.Conn, want int) client.ClusterStatus {
	t.Helper()
	var st client.ClusterStatus
	testkit.Wait(t, 90*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		if st, err = client.ReadClusterStatus(ctx, nc, 300*time.Millisecond); err != nil {
			return err
		}
		leading := 0
		for _, c := range st.Coordinators {
			if c.State == protocol.CoordinatorLeading {
				leading++
			}
		}
		if len(st.Coordinators) != want || leading != 1 {
			return fmt.Errorf("coordinators %+v, want %d with one leading", st.Coordinators, want)
		}
		if len(st.Servers) != 3 {
			return fmt.Errorf("servers %+v, want 3", st.Servers)
		}
		for _, b := range st.Buckets {
			current := 0
			for _, p := range b.Peers {
				if p.Current {
					current++
				}
			}
			if b.Replicas != 3 || b.Leader == "" || current != 2 {
				return fmt.Errorf("bucket %+v, want 3 replicas, a leader and two current peers", b)
			}
		}
		return nil
	})
	return st
}

// TestServeCluster: three serve nodes started together form one cluster with R3
// buckets, one leading coordinator and two standbys; a coordinator started before the
// cluster waits for it; a coordinator asking for another replica count is refused; and
// `jobbus cluster` shows it all.
func TestServeCluster(t *testing.T) {
	t.Parallel()
	sc := startServeCluster(t)
	// Started before the cluster answers: it waits (and says so) instead of exiting.
	early := startProc(t, nil, "--nats", sc.urls[2], "coordinator")
	nc := sc.dial(0)
	st := healthy(t, nc, 4)
	if !strings.Contains(early.stderr.String(), "waiting for") {
		t.Errorf("the early coordinator did not say what it waited for:\n%s", early.stderr)
	}
	if st.Cluster != "jobbus" || len(st.URLs) != 3 {
		t.Errorf("cluster %q, urls %v; want jobbus and 3 URLs", st.Cluster, st.URLs)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := client.New(sc.dial(1))
	id, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "hello"})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	if j, err := cl.Wait(ctx, id); err != nil || j.State != protocol.StateCompleted {
		t.Fatalf("wait: %+v, %v; want COMPLETED", j, err)
	}

	t.Run("MixedReplicasRefused", func(t *testing.T) {
		p := startProc(t, nil, "--nats", sc.urls[1], "coordinator", "--replicas", "1")
		if code := p.wait(); code != cli.ExitError || !strings.Contains(p.stderr.String(), "bucket exists with another replica count") {
			t.Fatalf("exit %d, want 1 refusing the replica count:\n%s", code, p.stderr)
		}
	})
	t.Run("ClusterCommand", func(t *testing.T) {
		code, out, errs := cliRun([]string{"--nats", sc.urls[0]}, "cluster")
		if code != cli.ExitOK {
			t.Fatalf("exit %d: %s", code, errs)
		}
		for _, want := range []string{"cluster jobbus", "n0", "n1", "n2", "meta leader",
			"JOBS           3", "JOBBUS_LEADER  3", "TERM", "leading", "standby"} {
			if !strings.Contains(out, want) {
				t.Errorf("jobbus cluster lacks %q:\n%s", want, out)
			}
		}
		// Any of the four may lead (the early one often does); the lease names it.
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[1] == "leading" && !strings.Contains(out, "LEASE  held by "+f[0]) {
				t.Errorf("the lease does not name the leading coordinator %s:\n%s", f[0], out)
			}
		}
		code, out, errs = cliRun([]string{"--nats", sc.urls[0]}, "cluster", "--json")
		if code != cli.ExitOK || !strings.Contains(out, `"state":"leading"`) {
			t.Fatalf("exit %d, --json:\n%s%s", code, out, errs)
		}
	})
}

// TestServeClusterFailover (long: JOBBUS_LONG_TESTS=1, `task test-cluster`) SIGKILLs
// the node whose coordinator leads, five times, under a trickle of submissions, and
// measures from the kill to the first accepted submission and to its completion; no
// accepted job is lost.
func TestServeClusterFailover(t *testing.T) {
	if os.Getenv("JOBBUS_LONG_TESTS") == "" {
		t.Skip("long: set JOBBUS_LONG_TESTS=1 (task test-cluster)")
	}
	sc := startServeCluster(t)
	ncs := []*nats.Conn{sc.dial(0), sc.dial(1), sc.dial(2)}
	var accepted []string
	var toSubmit, toComplete []time.Duration
	for trial := range 5 {
		st := healthy(t, ncs[0], 3)
		leader := slices.IndexFunc(sc.procs, func(p *proc) bool {
			return p.cmd.Process.Pid == st.Coordinators[0].PID
		})
		if leader < 0 {
			t.Fatalf("no serve process runs the leading coordinator %+v", st.Coordinators[0])
		}
		cl := client.New(ncs[(leader+1)%3], client.WithTimeout(time.Second))
		killed := time.Now()
		sc.procs[leader].signal(syscall.SIGKILL)
		var id string
		for id == "" {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			got, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "failover " + strconv.Itoa(trial)})
			cancel()
			if err == nil {
				id = got
			} else if time.Since(killed) > 60*time.Second {
				t.Fatalf("no submission accepted within 60 s of the kill: %v", err)
			}
		}
		submitted := time.Since(killed)
		accepted = append(accepted, id)
		testkit.Wait(t, 60*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			j, err := cl.Status(ctx, id)
			if err == nil && j.State != protocol.StateCompleted {
				err = fmt.Errorf("job %s is %s", id, j.State)
			}
			return err
		})
		completed := time.Since(killed)
		toSubmit, toComplete = append(toSubmit, submitted), append(toComplete, completed)
		t.Logf("trial %d: killed n%d; first accepted submit after %v, its completion after %v", trial+1, leader, submitted.Round(time.Millisecond), completed.Round(time.Millisecond))
		<-sc.procs[leader].done
		sc.restart(leader)
	}
	t.Logf("leader SIGKILL, 3 serve nodes, median of 5: first accepted submit %v, first completion %v",
		median(toSubmit).Round(time.Millisecond), median(toComplete).Round(time.Millisecond))
	healthy(t, ncs[0], 3)
	cl := client.New(ncs[0])
	for _, id := range accepted {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		j, err := cl.Status(ctx, id)
		cancel()
		if err != nil || j.State != protocol.StateCompleted {
			t.Errorf("accepted job %s: %+v, %v; want COMPLETED", id, j, err)
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestServeLeafNode: an edge serve that dials out to a hub serve as a leaf node runs
// no coordinator and no JetStream of its own; its local worker runs the jobs the hub's
// coordinator assigns, and its bridge serves spec clients at the edge.
func TestServeLeafNode(t *testing.T) {
	t.Parallel()
	ports := freePorts(t, 4)
	hubURL := fmt.Sprintf("nats://127.0.0.1:%d", ports[0])
	startProc(t, nil, "serve", "--data-dir", filepath.Join(t.TempDir(), "hub"), "--nats-listen", hubURL[len("nats://"):],
		"--leafnode-listen", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--worker-port", "-1", "--client-port", "-1", "--http-listen", "-").logged("coordinator serving")
	edge := startProc(t, nil, "serve", "--data-dir", filepath.Join(t.TempDir(), "edge"),
		"--nats-listen", fmt.Sprintf("127.0.0.1:%d", ports[2]),
		"--leafnode-remote", fmt.Sprintf("nats-leaf://127.0.0.1:%d", ports[1]),
		"--worker-port", "-1", "--client-port", strconv.Itoa(ports[3]), "--http-listen", "-", "--workers", "1")
	edge.logged("leaf node: no coordinator here")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The edge's spec client port reaches the hub's coordinator over the leaf connection.
	tcp, err := client.DialTCP(ctx, fmt.Sprintf("127.0.0.1:%d", ports[3]))
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	var ws []protocol.Worker
	testkit.Wait(t, 30*time.Second, func() error {
		ws, err = tcp.Workers(ctx)
		if err == nil && len(ws) != 1 {
			err = fmt.Errorf("workers %+v, want the edge's one", ws)
		}
		return err
	})
	hub := client.New(sc0(t, hubURL))
	id, err := hub.Submit(ctx, "WORD_COUNT", map[string]string{"text": "a b c"})
	if err != nil {
		t.Fatal(err)
	}
	j, err := hub.Wait(ctx, id)
	// The edge's worker is the only one anywhere.
	if err != nil || j.State != protocol.StateCompleted || j.Result == nil || *j.Result != "3" {
		t.Fatalf("job %+v, %v; want COMPLETED (3) by the edge's worker %s", j, err, ws[0].WorkerID)
	}
}

func sc0(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestServeRefusesBadClusterFlags: a malformed address, route or name for the embedded
// server is a usage error naming its flag (exit 2), before anything starts, not
// embeddednats's or nats-server's words with exit 1, nor a server that starts and dials
// a route without a port for ever. Processes, so that such a server cannot hang the test.
func TestServeRefusesBadClusterFlags(t *testing.T) {
	t.Parallel()
	route := "nats-route://127.0.0.1:6222"
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"RouteNotAURL", []string{"--routes", "nats-route://a:6222,foo"}, `--routes: "foo" is not a URL like nats-route://host:6222`},
		{"RouteWithoutPort", []string{"--routes", "nats-route://a"}, `--routes: "nats-route://a" is not a URL`},
		{"RouteWithoutPortHidesItsPassword", []string{"--routes", "nats-route://ops:s3cret@a"}, `--routes: "nats-route://ops:xxxxx@a" is not a URL`},
		{"LeafNotAURLHidesItsToken", []string{"--leafnode-remote", "nats-leaf://s3cret@"}, `--leafnode-remote: "nats-leaf://xxxxx@" is not a URL`},
		{"ClusterListen", []string{"--routes", route, "--cluster-listen", "bogus"}, `--cluster-listen must be HOST:PORT like 0.0.0.0:6222, got "bogus"`},
		{"ClusterListenPort", []string{"--routes", route, "--cluster-listen", "127.0.0.1:99999"}, `--cluster-listen must be HOST:PORT`},
		{"EmptyClusterName", []string{"--routes", route, "--cluster-name", ""}, "--cluster-name must not be empty"},
		{"ClusterNameSpaces", []string{"--routes", route, "--cluster-name", "a b"}, `--cluster-name must not contain spaces, got "a b"`},
		{"ServerNameSpaces", []string{"--routes", route, "--server-name", "node 1"}, `--server-name must not contain spaces, got "node 1"`},
		{"LeafRemote", []string{"--leafnode-remote", "foo"}, `--leafnode-remote: "foo" is not a URL like nats-leaf://hub:7422`},
		{"LeafListen", []string{"--leafnode-listen", "bogus"}, `--leafnode-listen must be HOST:PORT like 0.0.0.0:7422, got "bogus"`},
		{"NATSListen", []string{"--nats-listen", "127.0.0.1:bogus"}, `--nats-listen must be HOST:PORT like 127.0.0.1:4222, got "127.0.0.1:bogus"`},
		{"NATSHTTPListen", []string{"--nats-http-listen", "bogus"}, `--nats-http-listen must be HOST:PORT`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"serve", "--data-dir", filepath.Join(t.TempDir(), "data"), "--server-name", "n1",
				"--worker-port", "-1", "--client-port", "-1", "--http-listen", "-"}, tc.args...)
			p := startProc(t, nil, args...)
			code := p.wait()
			out, errs := p.stdout.String(), p.stderr.String()
			if code != cli.ExitUsage || !strings.Contains(errs, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errs, cli.ExitUsage, tc.want)
			}
			if out != "" || strings.Count(errs, "\n") != 1 {
				t.Errorf("want one line on stderr and nothing on stdout, got stdout %q stderr %q", out, errs)
			}
		})
	}
}

// TestClusterCommandWithoutAMajority: with two of three servers down, JetStream answers
// nothing; `jobbus cluster` still shows what it knows, saying JetStream did not answer,
// instead of printing only a context deadline after 10 s.
func TestClusterCommandWithoutAMajority(t *testing.T) {
	t.Parallel()
	c := jobbustest.StartRestartableCluster(t, 3)
	nc := natsConnect(t, c.Nodes[0].ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, b := range []string{protocol.LeaderBucket, protocol.JobsBucket} {
		if _, err := coordinator.OpenBucket(ctx, nc, js, coordinator.DefaultConfig(), jetstream.KeyValueConfig{Bucket: b, History: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// The survivor is a server that leads neither bucket's stream: a stream whose
	// leader survives may go on answering for a while without its majority.
	leaders := map[string]bool{}
	for _, b := range []string{protocol.LeaderBucket, protocol.JobsBucket} {
		st, err := js.Stream(ctx, "KV_"+b)
		if err != nil {
			t.Fatal(err)
		}
		if ci := st.CachedInfo().Cluster; ci != nil {
			leaders[ci.Leader] = true
		}
	}
	survivor := slices.IndexFunc([]string{"n0", "n1", "n2"}, func(n string) bool { return !leaders[n] })
	for i := range 3 {
		if i != survivor {
			c.Stop(t, i)
		}
	}
	nc = natsConnect(t, c.Nodes[survivor].ClientURL())
	if js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	testkit.Wait(t, 60*time.Second, func() error {
		for _, b := range []string{protocol.LeaderBucket, protocol.JobsBucket} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := js.Stream(ctx, "KV_"+b)
			cancel()
			if err != nil {
				return nil
			}
		}
		return errors.New("JetStream still answers for both buckets")
	})
	code, out, errs := cliRun([]string{"--nats", c.Nodes[survivor].ClientURL()}, "cluster")
	if code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q; want 0 and the status", code, errs)
	}
	for _, want := range []string{fmt.Sprintf("cluster jobbus-test, connected to n%d", survivor), "JOBBUS_LEADER", "JOBS"} {
		if !strings.Contains(out, want) {
			t.Errorf("jobbus cluster lacks %q:\n%s", want, out)
		}
	}
	// Without its majority JetStream either says nothing (the wait runs out) or says at
	// once that it is unavailable: either is shown, beside what was read.
	if !strings.Contains(out, "JetStream did not answer within 5s") && !strings.Contains(out, "JetStream system temporarily unavailable") {
		t.Errorf("jobbus cluster does not say JetStream is unavailable:\n%s", out)
	}
}

// TestServeNodeNamedFromABarePort: --nats-listen takes a bare port (on 127.0.0.1), and
// a cluster node's default name is <host>-<that port>, not a refusal asking for a fixed
// port.
func TestServeNodeNamedFromABarePort(t *testing.T) {
	t.Parallel()
	ports := freePorts(t, 2)
	p := startProc(t, nil, "serve", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--nats-listen", strconv.Itoa(ports[0]), "--cluster-listen", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--routes", fmt.Sprintf("nats-route://127.0.0.1:%d", ports[1]),
		"--worker-port", "-1", "--client-port", "-1", "--http-listen", "-")
	p.logged("embedded NATS started")
	nc := natsConnect(t, fmt.Sprintf("nats://127.0.0.1:%d", ports[0]))
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	if got, want := nc.ConnectedServerName(), fmt.Sprintf("%s-%d", host, ports[0]); got != want {
		t.Fatalf("server name %q, want %q", got, want)
	}
}

// TestServeJoiningNATSRefusesClusterName: --cluster-name and --nats-system-user, like
// every other flag of the embedded server, are refused when serve joins another NATS,
// not silently unused.
func TestServeJoiningNATSRefusesClusterName(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"cluster-name", "nats-system-user"} {
		t.Run(flag, func(t *testing.T) {
			t.Parallel()
			p := startProc(t, nil, "--nats", "nats://127.0.0.1:1", "serve", "--"+flag, "east",
				"--worker-port", "-1", "--client-port", "-1", "--http-listen", "-")
			want := "--" + flag + " configures the embedded NATS server, which serve does not start when it joins nats://127.0.0.1:1"
			if code := p.wait(); code != cli.ExitUsage || !strings.Contains(p.stderr.String(), want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, p.stderr, cli.ExitUsage, want)
			}
		})
	}
}

// TestServeLeafRefusesCoordinatorFlags: a leaf node runs no coordinator and no
// JetStream, so the flags that configure them are a usage error naming the flag (exit
// 2), as for serve --nats; before, they were silently ignored. Set in the environment,
// they are shared configuration and stay quietly unused.
func TestServeLeafRefusesCoordinatorFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ flag, value string }{
		{"replicas", "3"}, {"reconfigure-buckets", "true"}, {"leader-lease-millis", "5000"},
		{"heartbeat-timeout-millis", "9000"}, {"coordinator-id", "c1"}, {"sync", "always"}, {"nats-max-store", "1G"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			t.Parallel()
			p := startProc(t, nil, "serve", "--data-dir", filepath.Join(t.TempDir(), "data"), "--server-name", "edge",
				"--nats-listen", "127.0.0.1:-1", "--leafnode-remote", "nats-leaf://127.0.0.1:1", "--"+tc.flag+"="+tc.value,
				"--worker-port", "-1", "--client-port", "-1", "--http-listen", "-")
			want := "--" + tc.flag + " does not apply to a leaf node (--leafnode-remote)"
			if code := p.wait(); code != cli.ExitUsage || !strings.Contains(p.stderr.String(), want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, p.stderr, cli.ExitUsage, want)
			}
		})
	}
	t.Run("FromTheEnvironment", func(t *testing.T) {
		t.Parallel()
		p := startProc(t, []string{"JOBBUS_REPLICAS=3", "JOBBUS_SYNC=always"}, "serve", "--data-dir", filepath.Join(t.TempDir(), "data"),
			"--server-name", "edge", "--nats-listen", "127.0.0.1:-1", "--leafnode-remote", "nats-leaf://127.0.0.1:1",
			"--worker-port", "-1", "--client-port", "-1", "--http-listen", "-")
		p.logged("leaf node: no coordinator here")
	})
}

// TestClusterCommandListsTaskTypes: `jobbus cluster` lists every bucket a coordinator
// opens, TASK_TYPES included (in text and --json), as docs/deployment.md says; before,
// it left TASK_TYPES out, so its replicas could not be checked.
func TestClusterCommandListsTaskTypes(t *testing.T) {
	t.Parallel()
	s := setup(t)
	code, out, errs := cliRun([]string{"--nats", s.url}, "cluster")
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"JOBBUS_LEADER", "JOBS ", "TASK_TYPES     1"} {
		if !strings.Contains(out, want) {
			t.Errorf("jobbus cluster lacks %q:\n%s", want, out)
		}
	}
	code, out, errs = cliRun([]string{"--nats", s.url}, "cluster", "--json")
	if code != cli.ExitOK {
		t.Fatalf("--json: exit %d: %s", code, errs)
	}
	var st client.ClusterStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if !slices.ContainsFunc(st.Buckets, func(b client.BucketStatus) bool {
		return b.Bucket == protocol.TaskTypesBucket && b.Replicas == 1 && b.Error == ""
	}) {
		t.Errorf("--json buckets %+v lack %s with 1 replica", st.Buckets, protocol.TaskTypesBucket)
	}
}
