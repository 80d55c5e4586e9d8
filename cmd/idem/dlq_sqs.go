package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/idem-go/idem/broker/idemsqs"
	"github.com/spf13/cobra"
)

func newDLQSQSCmd() *cobra.Command {
	c := groupCmd("sqs", "Inspect, redrive and purge the dead letters of an Amazon SQS (idemsqs) consumer",
		newSQSListCmd(), newSQSShowCmd(), newSQSRedriveCmd(), newSQSPurgeCmd())
	c.Long = `Inspect, redrive and purge the dead letters of an idemsqs consumer.

--queue is the URL of the dead-letter queue: the consumer's DeadLetterQueueURL,
or the target of its work queue's redrive policy. Credentials and the region
come from the AWS SDK's usual sources (environment, shared config, role);
--endpoint (IDEM_SQS_URL) points at a local SQS-compatible server, and
--query-protocol talks to one that only speaks SQS's query protocol (goaws).
Zero dead letters is the normal state: "list --fail-if-any" exits 3 when there
are some, for monitoring scripts and cron alerts.`
	return c
}

// sqsConfig is the connection and queue every "dlq sqs" subcommand takes.
type sqsConfig struct {
	queue, endpoint, region string
	query                   bool
}

func addSQSFlags(cmd *cobra.Command) *sqsConfig {
	cfg := &sqsConfig{}
	cmd.Flags().StringVar(&cfg.queue, "queue", "", "URL of the dead-letter queue")
	cmd.Flags().StringVar(&cfg.endpoint, "endpoint", "", "SQS endpoint URL, for a local SQS-compatible server (default: AWS's)")
	envFlag(cmd, "endpoint", "IDEM_SQS_URL")
	cmd.Flags().StringVar(&cfg.region, "region", "", "AWS region (default: the SDK's configuration; us-east-1 with --endpoint)")
	cmd.Flags().BoolVar(&cfg.query, "query-protocol", false, "speak SQS's query protocol (for servers such as goaws that lack AWS JSON)")
	return cfg
}

// client checks the command line and returns an SQS client.
func (cfg *sqsConfig) client(ctx context.Context) (*sqs.Client, error) {
	if cfg.queue == "" {
		return nil, usageErrorf("missing --queue URL (the dead-letter queue), e.g. https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq")
	}
	if !strings.HasPrefix(cfg.queue, "http://") && !strings.HasPrefix(cfg.queue, "https://") {
		return nil, usageErrorf("--queue %q is not a queue URL (http:// or https://)", cfg.queue)
	}
	var opts []func(*config.LoadOptions) error
	region := cfg.region
	if region == "" && cfg.endpoint != "" && os.Getenv("AWS_REGION") == "" && os.Getenv("AWS_DEFAULT_REGION") == "" {
		region = "us-east-1"
	}
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	}
	if cfg.endpoint != "" && os.Getenv("AWS_ACCESS_KEY_ID") == "" && os.Getenv("AWS_PROFILE") == "" {
		// A local server checks no signature.
		opts = append(opts, config.WithCredentialsProvider(aws.AnonymousCredentials{}))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("AWS configuration: %w", err)
	}
	return sqs.NewFromConfig(awsCfg, func(o *sqs.Options) {
		if cfg.endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.endpoint)
		}
		if cfg.query {
			idemsqs.QueryProtocol(o)
		}
	}), nil
}

// withSQS connects, checks that the queue exists, and runs fn.
func withSQS(cmd *cobra.Command, cfg *sqsConfig, fn func(c *sqs.Client, depth int) error) error {
	c, err := cfg.client(cmd.Context())
	if err != nil {
		return err
	}
	out, err := c.GetQueueAttributes(cmd.Context(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(cfg.queue), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages}})
	if err != nil {
		return fmt.Errorf("cannot read queue %s: %v (check --queue, --endpoint and the AWS credentials)", cfg.queue, err)
	}
	var depth int
	fmt.Sscan(out.Attributes["ApproximateNumberOfMessages"], &depth)
	return fn(c, depth)
}

func newSQSListCmd() *cobra.Command {
	var (
		limit     int
		failIfAny bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "One line per dead letter: id, reason, attempts, failure times, consumer, origin, last error",
		Long: `List the dead letters without consuming them: each is hidden while it is read
and made visible again at the end (SQS counts the read as a receive).

With --fail-if-any it exits 3 when the queue is not empty:

  idem dlq sqs list --queue "$DLQ_URL" --fail-if-any || alert "orders has dead letters"

Exit status: 0 listed (or empty), 1 the command failed, 2 the command line was
wrong, 3 --fail-if-any and dead letters.`,
		Args: cobra.NoArgs,
	}
	cfg := addSQSFlags(cmd)
	cmd.Flags().IntVar(&limit, "limit", 100, "show at most N dead letters")
	cmd.Flags().BoolVar(&failIfAny, "fail-if-any", false, "exit 3 when the dead-letter queue is not empty (for monitoring)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if limit < 1 {
			return usageErrorf("--limit must be at least 1, got %d", limit)
		}
		return withSQS(cmd, cfg, func(c *sqs.Client, depth int) error {
			msgs, err := idemsqs.ListDeadLetters(cmd.Context(), c, cfg.queue, limit)
			if err != nil {
				return err
			}
			total := max(depth, len(msgs))
			writeSQSDeadLetterList(cmd.OutOrStdout(), cfg.queue, msgs, total, time.Now())
			if failIfAny && total > 0 {
				return exitCodeError{exitDeadLetters, fmt.Errorf("%d dead letter(s) in %s", total, cfg.queue)}
			}
			return nil
		})
	}
	return cmd
}

func writeSQSDeadLetterList(w io.Writer, queue string, msgs []idemsqs.DeadMessage, total int, now time.Time) {
	rows := make([]listRow, len(msgs))
	for i, m := range msgs {
		rows[i] = listRow{m.ID, m.DeadLetter, m.Age(now)}
	}
	writeListRows(w, queue, rows, total)
}

func newSQSShowCmd() *cobra.Command {
	var (
		limit    int
		showBody bool
	)
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Print one dead letter: why it failed, every attribute and the body",
		Long: `Print the dead letter with id ID (its idem id or its SQS message id): the
failure report, every message attribute and a preview of the body (the first
1 KiB; --body prints all of it). The message stays in the queue.`,
		Args: cobra.ExactArgs(1),
	}
	cfg := addSQSFlags(cmd)
	cmd.Flags().IntVar(&limit, "limit", 1000, "look at most at N dead letters to find ID")
	cmd.Flags().BoolVar(&showBody, "body", false, "print the whole body, not a 1 KiB preview")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if limit < 1 {
			return usageErrorf("--limit must be at least 1, got %d", limit)
		}
		return withSQS(cmd, cfg, func(c *sqs.Client, _ int) error {
			msgs, err := idemsqs.ListDeadLetters(cmd.Context(), c, cfg.queue, limit)
			if err != nil {
				return err
			}
			found := 0
			for _, m := range msgs {
				if m.ID != args[0] && m.OriginalID != args[0] && m.MessageID != args[0] {
					continue
				}
				if found > 0 {
					fmt.Fprintln(cmd.OutOrStdout())
				}
				found++
				writeSQSDeadLetter(cmd.OutOrStdout(), m, showBody, time.Now())
			}
			if found == 0 {
				return fmt.Errorf("message %q not found in %s (looked at %d dead letter(s))", args[0], cfg.queue, len(msgs))
			}
			return nil
		})
	}
	return cmd
}

func writeSQSDeadLetter(w io.Writer, m idemsqs.DeadMessage, wholeBody bool, now time.Time) {
	fmt.Fprintln(w, sanitize(m.Report(now), "\n"))
	fmt.Fprintln(w, "  attributes:")
	for _, k := range slices.Sorted(maps.Keys(m.Attributes)) {
		fmt.Fprintf(w, "    %s: %s\n", cell(k, listFieldWidth), cell(m.Attributes[k], headerValueBytes))
	}
	writeBody(w, m.Body, wholeBody)
}

func newSQSRedriveCmd() *cobra.Command {
	var (
		all         bool
		reason      string
		dryRun      bool
		maxRedrives int
		limit       int
		moveTask    bool
	)
	cmd := &cobra.Command{
		Use:   "redrive (ID... | --all | --reason REASON)",
		Short: "Send chosen dead letters back to the queue they were first sent to",
		Long: `Send dead letters back to the queue they were first sent to, with fresh
attempts: run it after fixing what made them fail. Choose them explicitly, by
id, --all, or --reason (max_attempts, permanent, mismatch, missing_id,
invalid_id, or max_receive_count for those SQS's own redrive policy moved).

Each message is deleted from the dead-letter queue only after its copy was
sent. A message redriven --max-redrives times already stays in the dead
letters. --dry-run prints what would move and changes nothing.

--all --move-task asks SQS itself to move every message back to its source
queue (StartMessageMoveTask, for the dead-letter queue of a redrive policy):
no filter, no cap, the attributes kept. Where the server has no move tasks
(goaws), it says so and redrives by receive and send instead.`,
	}
	cfg := addSQSFlags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "redrive every dead letter")
	cmd.Flags().StringVar(&reason, "reason", "", "redrive the dead letters with this reason")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be redriven; change nothing")
	cmd.Flags().IntVar(&maxRedrives, "max-redrives", idemsqs.DefaultMaxRedrives, "leave messages redriven this many times already")
	cmd.Flags().IntVar(&limit, "limit", 1000, "look at most at N dead letters")
	cmd.Flags().BoolVar(&moveTask, "move-task", false, "with --all: let SQS move the messages back (StartMessageMoveTask)")
	cmd.RunE = func(cmd *cobra.Command, ids []string) error {
		if err := redriveChoice(ids, all, reason, maxRedrives, limit); err != nil {
			return err
		}
		if moveTask && (!all || dryRun) {
			return usageErrorf("--move-task moves every message: use it with --all and without --dry-run")
		}
		match := func(m idemsqs.DeadMessage) bool {
			switch {
			case all:
				return true
			case reason != "":
				return string(m.Reason) == reason
			}
			return slices.Contains(ids, m.ID) || slices.Contains(ids, m.OriginalID)
		}
		return withSQS(cmd, cfg, func(c *sqs.Client, _ int) error {
			out := cmd.OutOrStdout()
			var res idemsqs.RedriveResult
			if dryRun {
				msgs, err := idemsqs.ListDeadLetters(cmd.Context(), c, cfg.queue, limit)
				if err != nil {
					return err
				}
				for _, m := range msgs {
					switch {
					case !match(m):
					case m.Redrives >= maxRedrives:
						res.Capped = append(res.Capped, m.ID)
					default:
						res.Redriven = append(res.Redriven, m.ID)
						fmt.Fprintf(out, "would redrive %s (%s after %d attempt(s)) to %s\n",
							cell(m.ID, listFieldWidth), cell(string(m.Reason), listFieldWidth), m.Attempts, cell(m.Origin, listFieldWidth))
					}
				}
			} else {
				if moveTask {
					handle, err := idemsqs.MoveBack(cmd.Context(), c, cfg.queue)
					if err == nil {
						fmt.Fprintf(out, "started SQS message move task %s: every message of %s goes back to its source queue\n", cell(handle, headerValueBytes), cfg.queue)
						return nil
					}
					fmt.Fprintf(out, "no SQS message move task (%s); redriving by receive and send\n", cell(err.Error(), headerValueBytes))
				}
				var err error
				res, err = idemsqs.Redrive(cmd.Context(), c, cfg.queue, match, &idemsqs.RedriveOptions{MaxRedrives: maxRedrives, Limit: limit})
				for _, id := range res.Redriven {
					fmt.Fprintf(out, "redriven %s\n", cell(id, listFieldWidth))
				}
				if err != nil {
					fmt.Fprintf(out, "redrove %d message(s) from %s before the error\n", len(res.Redriven), cfg.queue)
					return err
				}
			}
			writeRedriveSummary(out, dryRun, res.Redriven, res.Capped, maxRedrives, cfg.queue)
			return missingIDs(ids, res.Redriven, res.Capped, cfg.queue)
		})
	}
	return cmd
}

func newSQSPurgeCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "purge --yes",
		Short: "Delete every message in the dead-letter queue (needs --yes)",
		Long: `Delete every message in the dead-letter queue (SQS PurgeQueue: it may take up
to a minute, and SQS allows one purge a minute). It cannot be undone, so it
refuses to run without --yes.`,
		Args: cobra.NoArgs,
	}
	cfg := addSQSFlags(cmd)
	cmd.Flags().BoolVar(&yes, "yes", false, "really delete every dead letter")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if !yes {
			if cfg.queue == "" {
				return usageErrorf("missing --queue URL (the dead-letter queue)")
			}
			return usageErrorf("purge deletes every message in %s and cannot be undone; add --yes", cfg.queue)
		}
		return withSQS(cmd, cfg, func(c *sqs.Client, depth int) error {
			if err := idemsqs.Purge(cmd.Context(), c, cfg.queue); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "purged about %d message(s) from %s\n", depth, cfg.queue)
			return nil
		})
	}
	return cmd
}
