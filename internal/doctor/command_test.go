package doctor

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/ortenv"
)

// `scorer doctor` on this GPU-less host: it reports the CPU path with the
// reason there is no GPU and exits 0 for DEVICE=auto; DEVICE=cuda exits 1
// with the cause; --json is the same report as JSON.
func TestCommand(t *testing.T) {
	if probe, shutdown, err := gpupool.NewNVMLProbe(t.Context()); err == nil {
		shutdown()
		if _, err := probe.Devices(); err == nil {
			t.Skip("this machine has a GPU")
		}
	}
	env := map[string]string{"ORT_LIB": testenv.ORTLib(t), "MODEL_DIR": testenv.ScorerModelDir(t), "LOG_FORMAT": "json"}
	doctorRun := func(device string, args ...string) (string, error) {
		env["DEVICE"] = device
		var out bytes.Buffer
		err := Command(t.Context(), cli.Env{Getenv: func(k string) string { return env[k] }, Stdin: strings.NewReader(""), Stdout: &out, Stderr: io.Discard},
			append([]string{"--duration", "100ms"}, args...))
		return out.String(), err
	}

	out, err := doctorRun("auto")
	if err != nil {
		t.Fatalf("DEVICE=auto: %v\n%s", err, out)
	}
	if !strings.Contains(out, "verdict        OK: DEVICE=auto scores on the CPU here (no usable GPU: no NVIDIA driver") {
		t.Errorf("DEVICE=auto report:\n%s", out)
	}

	out, err = doctorRun("cuda")
	if !errors.Is(err, ErrNotOK) || cli.ExitCode(err) != 1 || !strings.Contains(err.Error(), "no NVIDIA driver") {
		t.Fatalf("DEVICE=cuda: err %v (exit %d), want exit 1 naming the cause\n%s", err, cli.ExitCode(err), out)
	}
	if !strings.Contains(out, "verdict        FAIL: DEVICE=cuda cannot work here") || !strings.Contains(out, "remedy: install an NVIDIA driver") {
		t.Errorf("DEVICE=cuda report:\n%s", out)
	}

	// PAIR_ENCODING reaches the doctor's sample, as it reaches every
	// subcommand that scores.
	env["PAIR_ENCODING"] = "joined"
	out, err = doctorRun("auto", "--json")
	var rep Report
	if err != nil || json.Unmarshal([]byte(out), &rep) != nil || !rep.OK || rep.Path != "cpu" || rep.Problem == nil || rep.Problem.Kind != ortenv.ProblemNoDriver {
		t.Fatalf("--json: err %v, report %+v\n%s", err, rep, out)
	}
	if rep.Sample.PairEncoding != "joined" {
		t.Errorf("PAIR_ENCODING=joined: the sample was encoded as %q", rep.Sample.PairEncoding)
	}
	delete(env, "PAIR_ENCODING")

	if _, err := doctorRun("auto", "--duration", "0s"); cli.ExitCode(err) != 2 {
		t.Errorf("--duration 0: err %v, want a usage error (exit 2)", err)
	}
}
