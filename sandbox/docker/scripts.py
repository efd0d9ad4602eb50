"""The POSIX sh scripts the Docker backend runs inside a run's container, and their argv.

User input reaches a script only as positional arguments, never inside its text. The scripts
run as the container user, like the harness (all capabilities are dropped, so root could not
signal the harness anyway), and need sh, grep, find, cut, sleep and /proc only (and readlink on
a kernel older than 5.14).

Docker starts every exec as a session and process-group leader (runc calls setsid), and no
process can join a session other than its own: the container's own processes (Docker's init
and the keep-alive command) are session 1, and anything else was started by an exec.
"""

from __future__ import annotations

from collections.abc import Sequence

MARKER_ENV = "HARNESS_EXEC_ID"
"""Set in every turn's environment; the kill script finds the turn's processes by it."""
SENTINEL = b"\x1eharness-exec "
"""Starts the line the wrapper prints on stderr just before it execs the harness."""

# The turn's command runs under this wrapper ($1 the working directory, then the argv). It
# checks what it can before the harness starts (so start() can raise StartFailed): the
# working directory and HOME are writable by the container user, the command exists. This is
# also the check of a new container (it runs, it has /bin/sh, its user can write), made by
# the run's first exec rather than by an exec of its own (one exec less, ~45 ms, per new
# container). Then it kills
# what is left of earlier turns of the run: every process outside session 1 and its own.
# One turn runs per run at a time, so such a process is a stray, typically the harness of a
# worker that was killed mid-turn, whose exec goes on without a reader. Then it prints the
# sentinel on stderr (its pid, how many strays it found and the identities of its stdout and
# stderr pipes, "-" for one that is not a pipe) and execs the harness, which keeps that pid
# and leads its own session. A pipe's identity is its inode, read from fdinfo by the shell
# itself (Linux 5.14 and later): readlink, forked only on an older kernel, cost a process
# start per turn.
_WRAPPER = r"""cd -- "$1" 2>/dev/null || {
    echo "harness-exec: cannot enter the working directory $1" >&2; exit 126; }
for d in "$1" "$HOME"; do
    [ -w "$d" ] || { echo "harness-exec: $d is not writable by uid $(id -u)" >&2; exit 126; }
done
shift
command -v -- "$1" >/dev/null 2>&1 || { echo "harness-exec: $1: command not found" >&2; exit 127; }
strays() {
    list=
    for d in /proc/[0-9]*; do
        read -r stat 2>/dev/null <"$d/stat" || continue
        set -- ${stat##*") "}
        [ "$1" != Z ] && [ "$4" != 1 ] && [ "$4" != "$$" ] && list="$list ${d#/proc/}"
    done
}
kill_strays() {
    strays; set -- $list
    found=$#
    i=0
    while [ "$#" -gt 0 ] && [ "$i" -lt 40 ]; do
        kill -KILL "$@" 2>/dev/null
        sleep 0.05
        strays; set -- $list
        i=$((i + 1))
    done
}
pipe_of() {
    pipe=-
    [ -p "/proc/$$/fd/$1" ] || return 0
    while read -r name value; do
        [ "$name" = ino: ] && { pipe="pipe:[$value]"; return 0; }
    done <"/proc/$$/fdinfo/$1"
    pipe=$(readlink "/proc/$$/fd/$1" 2>/dev/null) || pipe=-
}
kill_strays
pipe_of 1; out=$pipe
pipe_of 2; err=$pipe
printf '\036harness-exec %s %s %s %s\n' "$$" "$found" "$out" "$err" >&2
exec "$@"
"""

# Kills a turn's processes. A process belongs to the turn when its session or process group
# is the harness's pid ($1), when its environment carries the turn's marker ($2; children
# that start a session of their own keep it), or when it holds the turn's stdout or stderr
# pipe ($3, $4 as find -lname patterns; these also keep the exec's stream open). SIGTERM, up
# to $5 centiseconds for them to exit, then SIGKILL until none is left.
_KILLER = r"""leader=$1 marker=$2 out=$3 err=$4 grace=$5
members() {
    for d in /proc/[0-9]*; do
        read -r stat 2>/dev/null <"$d/stat" || continue
        set -- ${stat##*") "}
        [ "$1" != Z ] && { [ "$3" = "$leader" ] || [ "$4" = "$leader" ]; } && echo "${d#/proc/}"
    done
    grep -lzx -- "$marker" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
    find /proc/[0-9]*/fd -maxdepth 1 \( -lname "$out" -o -lname "$err" \) 2>/dev/null |
        cut -d/ -f3
}
now() { read -r up _ </proc/uptime; cs=$((${up%.*} * 100 + 1${up#*.} - 100)); }
pids=$(members)
[ -n "$pids" ] || exit 0
now
end=$((cs + grace))
kill -TERM $pids 2>/dev/null
while now && [ "$cs" -lt "$end" ]; do
    sleep 0.05
    pids=$(members)
    [ -n "$pids" ] || exit 0
done
i=0
while [ "$i" -lt 40 ]; do
    pids=$(members)
    [ -n "$pids" ] || exit 0
    kill -KILL $pids 2>/dev/null
    sleep 0.05
    i=$((i + 1))
done
echo "harness-kill: still running: $pids" >&2
exit 1
"""


def wrapper_argv(cwd: str, argv: Sequence[str]) -> list[str]:
    """Run ``argv`` in ``cwd`` under the wrapper, after the strays of earlier turns are gone."""
    return ["/bin/sh", "-c", _WRAPPER, "harness-exec", cwd, *argv]


def parse_sentinel(line: str) -> tuple[int, int, tuple[str, ...]]:
    """The harness's pid, the strays killed before it, its stdout and stderr pipes."""
    fields = line.split()
    return int(fields[0]), int(fields[1]), tuple(fields[2:4])


def killer_argv(leader: int, marker: str, pipes: Sequence[str], grace: float) -> list[str]:
    """Kill the turn led by ``leader`` (-1: none) and marked ``marker``, TERM then KILL."""
    patterns = [_glob_escape(p) if p.startswith("pipe:") else "-" for p in pipes[:2]]
    patterns += ["-"] * (2 - len(patterns))  # "-" matches no link target
    return [
        "/bin/sh",
        "-c",
        _KILLER,
        "harness-kill",
        str(leader),
        f"{MARKER_ENV}={marker}",
        *patterns,
        str(max(0, round(grace * 100))),
    ]


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "[]*?\\" else c for c in text)


_MEMORY_EVENTS = (
    "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null; true"
)


def memory_events_argv() -> list[str]:
    """Print the container's memory cgroup events (cgroup v2, or v1's oom_control)."""
    return ["sh", "-c", _MEMORY_EVENTS]


def oom_kill_count(memory_events: bytes) -> int:
    """The ``oom_kill`` count in what :func:`memory_events_argv` printed, 0 when absent."""
    for line in memory_events.decode(errors="replace").splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0
