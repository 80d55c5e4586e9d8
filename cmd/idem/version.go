package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newVersionCmd) }

func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the idem version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return nil
		},
	}
}

// versionLine is what "idem version" and "idem --version" print.
func versionLine() string {
	return fmt.Sprintf("idem %s (%s, %s/%s)", version(debug.ReadBuildInfo), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// version returns the module version the binary was built from: the tag
// for "go install …@v1.2.3", a pseudo-version or VCS revision otherwise, and
// "devel" when the build carries no information (go run, go test).
func version(readBuildInfo func() (*debug.BuildInfo, bool)) string {
	info, ok := readBuildInfo()
	if !ok || info == nil {
		return "devel"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "-dirty"
			}
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		return "devel+" + rev + modified
	}
	return "devel"
}
