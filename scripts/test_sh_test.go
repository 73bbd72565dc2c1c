// Package scripts holds the project's shell scripts; its test checks how scripts/test.sh
// chooses the databases the integration tests use.
package scripts

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeDocker is a docker command whose engine answers (docker info) and holds the images named
// in HAVE_IMAGES, and whose pulls fail as they do offline; it logs its calls to DOCKER_LOG.
const fakeDocker = `#!/bin/sh
echo "$*" >> "$DOCKER_LOG"
case "$1" in
info) exit 0 ;;
image) for i in $HAVE_IMAGES; do [ "$i" = "$3" ] && exit 0; done; exit 1 ;;
pull) echo "Error response from daemon: Get \"https://registry-1.docker.io/v2/\": dial tcp: lookup registry-1.docker.io: no such host" >&2; exit 1 ;;
esac
exit 1
`

// TestTestShFallsBackWhenDockerCannotPull: where Docker answers but cannot pull the images
// testcontainers needs, scripts/test.sh says so and points the tests at the machine's
// PostgreSQL and Redis; when those do not answer either, it stops at once with one line that
// says what to set. With the images present, it leaves the tests to the containers.
func TestTestShFallsBackWhenDockerCannotPull(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "docker"), []byte(fakeDocker), 0o755); err != nil {
		t.Fatal(err)
	}
	// Should the script go past its choice (TEST_SH_ENV_ONLY unheeded), it must not install
	// packages or run the suite from inside a test.
	for _, name := range []string{"go", "apt-get", "sudo"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\necho \"test.sh went on to run $0\" >&2\nexit 97\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A "PostgreSQL" that answers, and an address where nothing does.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	up := "postgres://postgres@" + ln.Addr().String() + "/postgres?sslmode=disable"
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downAddr := closed.Addr().String()
	down := "postgres://postgres@" + downAddr + "/postgres?sslmode=disable"
	closed.Close()

	cases := []struct {
		name, images, machine string
		wantCode              int
		wantDB                string
		wantErr               []string
	}{
		{name: "cannot pull, machine services answer", machine: up, wantDB: up,
			wantErr: []string{"DOCKER CANNOT PULL postgres:15 redis:7", "TEST_DATABASE_URL=" + up}},
		{name: "cannot pull one image", images: "postgres:15", machine: up, wantDB: up,
			wantErr: []string{"DOCKER CANNOT PULL redis:7"}},
		{name: "cannot pull, nothing answers", machine: down, wantCode: 2,
			wantErr: []string{"DOCKER CANNOT PULL postgres:15 redis:7", "no PostgreSQL answers on " + downAddr, "set TEST_DATABASE_URL"}},
		{name: "images present", images: "postgres:15 redis:7", machine: up, wantDB: ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command("bash", "test.sh")
			var env []string
			for _, kv := range os.Environ() {
				if k, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(k, "TEST_") && k != "POSTGRES_IMAGE" && k != "REDIS_IMAGE" && k != "PATH" {
					env = append(env, kv)
				}
			}
			cmd.Env = append(env, "PATH="+bin+":"+os.Getenv("PATH"), "TEST_SH_ENV_ONLY=1",
				"DOCKER_LOG="+filepath.Join(t.TempDir(), "docker.log"), "HAVE_IMAGES="+c.images,
				"MACHINE_DATABASE_URL="+c.machine)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != c.wantCode {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, c.wantCode, stderr.String())
			}
			for _, w := range c.wantErr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			if c.wantCode != 0 {
				if lines := strings.Count(strings.TrimSpace(lastLines(stderr.String())), "\n"); lines != 0 {
					t.Errorf("the stop is not one line:\n%s", stderr.String())
				}
				return
			}
			if got := "TEST_DATABASE_URL=" + c.wantDB; !strings.Contains(stdout.String(), got+"\n") {
				t.Errorf("stdout %q; want %s", stdout.String(), got)
			}
		})
	}
}

// lastLines is what follows the script's progress lines ("== …").
func lastLines(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "== ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
