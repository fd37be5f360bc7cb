// unstick-cnifail: a chained CNI plugin for the kind suite (tests/kind/test_cni.py,
// docs/kind.md) whose DEL fails on purpose, so that the real kubelet's KillPodSandbox
// fails as it does when a real plugin's DEL fails (calico#7272, multus-cni#669).
//
//   - ADD: outputs the previous plugin's result unchanged (CNI spec, chaining), in the
//     cniVersion it was given.
//   - DEL: fails with a CNI error (code 999) only for a pod whose name (K8S_POD_NAME in
//     CNI_ARGS) starts with the marker, and only while the flag file exists on the node
//     (the test removes it to heal the plugin); otherwise succeeds. The configuration's
//     "podPrefix" and "failFlag" replace the default marker and flag file.
//   - Every call is appended to the configuration's "logFile", if given (command,
//     K8S_POD_NAME, the result), so a test can see that the runtime called it.
//   - CHECK, GC, STATUS: succeed. VERSION: the versions below.
//
// Standard library only; built static (CGO_ENABLED=0) by the suite.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

const (
	// Marker is the prefix of the names of the pods whose DEL fails.
	Marker = "cnifail-"
	// Flag is the file on the node whose existence makes those DELs fail.
	Flag = "/run/unstick-cnifail/fail"
)

var supported = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

type cniError struct {
	CNIVersion string `json:"cniVersion"`
	Code       int    `json:"code"`
	Msg        string `json:"msg"`
	Details    string `json:"details,omitempty"`
}

func main() {
	os.Exit(run(os.Getenv, os.Stdin, os.Stdout))
}

func run(env func(string) string, stdin io.Reader, stdout io.Writer) int {
	raw, err := io.ReadAll(stdin)
	if err != nil {
		return fail(stdout, "", 5, "cannot read the network configuration", err.Error())
	}
	var conf map[string]json.RawMessage
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &conf); err != nil {
			return fail(stdout, "", 6, "the network configuration is not JSON", err.Error())
		}
	}
	version := "1.0.0"
	if v, ok := conf["cniVersion"]; ok {
		if err := json.Unmarshal(v, &version); err != nil {
			return fail(stdout, "", 6, "cniVersion is not a string", err.Error())
		}
	}
	prefix, flag, logFile := Marker, Flag, ""
	opts := map[string]*string{"podPrefix": &prefix, "failFlag": &flag, "logFile": &logFile}
	for key, into := range opts {
		if v, ok := conf[key]; ok {
			if err := json.Unmarshal(v, into); err != nil || *into == "" {
				return fail(stdout, version, 7, key+" is not a non-empty string", string(v))
			}
		}
	}
	cmd, pod := env("CNI_COMMAND"), podName(env("CNI_ARGS"))
	status := call(stdout, conf, version, cmd, pod, prefix, flag)
	if logFile != "" {
		logCall(logFile, fmt.Sprintf("%s pod=%s exit=%d\n", cmd, pod, status))
	}
	return status
}

func call(stdout io.Writer, conf map[string]json.RawMessage, version, cmd, pod, prefix, flag string) int {
	switch cmd {
	case "ADD":
		return add(stdout, conf, version)
	case "DEL":
		if strings.HasPrefix(pod, prefix) && exists(flag) {
			msg := fmt.Sprintf("unstick-cnifail refuses DEL of pod %s while %s exists", pod, flag)
			return fail(stdout, version, 999, msg, "a test plugin: remove the file to heal it")
		}
		return 0
	case "CHECK", "GC", "STATUS":
		return 0
	case "VERSION":
		out := map[string]any{"cniVersion": version, "supportedVersions": supported}
		return write(stdout, out)
	default:
		return fail(stdout, version, 4, fmt.Sprintf("unknown CNI_COMMAND %q", cmd), "")
	}
}

// add passes the previous plugin's result through, in the configuration's cniVersion.
func add(stdout io.Writer, conf map[string]json.RawMessage, version string) int {
	prev, ok := conf["prevResult"]
	if !ok {
		return write(stdout, map[string]any{"cniVersion": version})
	}
	var result map[string]json.RawMessage
	if err := json.Unmarshal(prev, &result); err != nil {
		return fail(stdout, version, 6, "prevResult is not a JSON object", err.Error())
	}
	v, _ := json.Marshal(version)
	result["cniVersion"] = v
	return write(stdout, result)
}

// podName is K8S_POD_NAME of CNI_ARGS ("K1=V1;K2=V2"), "" when absent.
func podName(args string) string {
	for _, kv := range strings.Split(args, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == "K8S_POD_NAME" {
			return v
		}
	}
	return ""
}

// logCall appends a line to the log file (best effort: a test aid, never a failure).
func logCall(path, line string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(line)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func write(stdout io.Writer, v any) int {
	if err := json.NewEncoder(stdout).Encode(v); err != nil {
		return 5
	}
	return 0
}

// fail writes the CNI error object to stdout and returns the exit status (non-zero).
func fail(stdout io.Writer, version string, code int, msg, details string) int {
	if version == "" {
		version = "1.0.0"
	}
	_ = json.NewEncoder(stdout).Encode(cniError{version, code, msg, details})
	return 1
}
