package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

func clusterCommand() *cli.Command {
	return &cli.Command{
		Name:  "cluster",
		Usage: "show the NATS servers, the buckets' replicas, and which coordinator leads",
		Description: `Shows the deployment NATS reaches: its servers (each jobbus serve answers for its
embedded server, with the JetStream meta group's currency), the replicas of jobbus's
buckets and how current each is, the leader lease, and every coordinator process with
its state (leading or standby) and since when. Coordinators and servers answer a
request; one that is paused or gone does not, and is not listed. More: docs/deployment.md.

Example:
   jobbus --nats nats://127.0.0.1:4222 cluster
   jobbus cluster --json`,
		Flags: []cli.Flag{
			jsonFlag(),
			millisFlag("gather-millis", client.DefaultGather, "how long to collect the answers of coordinators and servers"),
		},
		Action: func(c *cli.Context) error {
			if _, err := args(c); err != nil {
				return err
			}
			s, err := connect(c, false)
			if err != nil {
				return exitErr(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
			defer cancel()
			st, err := client.ReadClusterStatus(ctx, s.nc, millis(c, "gather-millis"))
			if err != nil {
				return exitErr(fmt.Errorf("cluster: %w", err))
			}
			if c.Bool("json") {
				return newPrinter(c.App.Writer, true).jsonLine(st)
			}
			return writeCluster(c.App.Writer, st, time.Now())
		},
	}
}

// writeCluster prints the cluster status as four short tables.
func writeCluster(w io.Writer, st client.ClusterStatus, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	where := "a lone server"
	if st.Cluster != "" {
		where = "cluster " + st.Cluster
	}
	fmt.Fprintf(tw, "NATS\t%s, connected to %s\n", where, st.Connected)
	fmt.Fprintf(tw, "URLS\t%s\n", strings.Join(st.URLs, ", "))
	if len(st.Servers) > 0 {
		fmt.Fprintln(tw, "\nSERVER\tURL\tJETSTREAM\tROUTES\tLEAF NODES")
		for _, s := range st.Servers {
			js := "off (uses its hub's)"
			if s.JetStream {
				js = "on"
				if s.MetaLeader == s.Name {
					js = "meta leader"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, s.URL, js, dashIfEmpty(strings.Join(s.Routes, ", ")), dashIfEmpty(strings.Join(s.Leafnodes, ", ")))
		}
		for _, s := range st.Servers {
			if s.MetaLeader == s.Name && len(s.Peers) > 0 {
				fmt.Fprintf(tw, "meta group\tleader %s; %s\n", s.Name, peers(s.Peers))
			}
		}
	}
	fmt.Fprintln(tw, "\nBUCKET\tREPLICAS\tLEADER\tOTHER REPLICAS\tRECORDS")
	for _, b := range st.Buckets {
		if b.Error != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t%s\t-\n", b.Bucket, b.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\n", b.Bucket, b.Replicas, dashIfEmpty(b.Leader), dashIfEmpty(peers(b.Peers)), b.Messages)
	}
	fmt.Fprintln(tw, "\nCOORDINATOR\tSTATE\tSINCE\tSERVER\tHOST\tPID\tVERSION")
	for _, co := range st.Coordinators {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", co.ID, co.State, ago(now, co.Since), dashIfEmpty(co.Server), dashIfEmpty(co.Host), co.PID, dashIfEmpty(co.Version))
	}
	if len(st.Coordinators) == 0 {
		fmt.Fprintln(tw, "(none answered)")
	}
	switch l := st.Lease; {
	case st.LeaseError != "":
		fmt.Fprintf(tw, "\nLEASE\tunknown: %s\n", st.LeaseError)
	case l == nil:
		fmt.Fprintln(tw, "\nLEASE\tnot held: no coordinator leads")
	default:
		fmt.Fprintf(tw, "\nLEASE\theld by %s, renewed %s\n", l.Holder, ago(now, l.Renewed.UnixMilli()))
	}
	if st.Term != "" {
		fmt.Fprintf(tw, "TERM\t%s\n", st.Term)
	}
	return tw.Flush()
}

// peers renders replicas: "n2 current, n3 behind by 4 (seen 1s ago)".
func peers(ps []protocol.Peer) string {
	parts := make([]string, 0, len(ps))
	for _, p := range ps {
		switch {
		case p.Offline:
			parts = append(parts, p.Name+" offline")
		case p.Current:
			parts = append(parts, p.Name+" current")
		default:
			parts = append(parts, fmt.Sprintf("%s behind by %d (seen %s ago)", p.Name, p.Lag, short(time.Duration(p.ActiveMillis)*time.Millisecond)))
		}
	}
	return strings.Join(parts, ", ")
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
