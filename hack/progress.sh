# shellcheck shell=bash
# Long steps that say what they are doing: sourced by the scripts that build or install (hack/
# cluster.sh, real-node.sh, build-tools.sh, image.sh, demo.sh).
#
#   progress_run NAME TYPICAL LOG CMD...      CMD's stderr to LOG, its stdout passed on
#   progress_run_quiet NAME TYPICAL LOG CMD...  both to LOG (package managers)
#
# While CMD runs, a line on stderr tells the time it has taken against TYPICAL seconds (the time
# the step took on the 2-core development machine) and what it does now: the packages the Go
# compiler or rustc are compiling (read from their command lines), else the last line of LOG. On a
# terminal the line is redrawn every 2 s, otherwise one is printed every 30 s (the first after
# 10 s). A step that takes under 10 s prints nothing. If CMD fails, the last 40 lines of LOG
# follow, and its exit status is returned.

progress_elapsed() { # seconds -> "1m05s"
  local s=$1
  if ((s >= 60)); then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi
}

# What the processes under PID compile now (Go packages, Rust crates), at most three, else "".
progress_compiling() {
  local root=$1
  ps -e -o pid=,ppid=,args= 2>/dev/null | awk -v root="$root" '
    { pid = $1; parent[pid] = $2; $1 = ""; $2 = ""; args[pid] = $0 }
    END {
      n = 0
      for (p in args) {
        q = p; under = 0
        for (i = 0; i < 64 && q != "" && q != 0; i++) { if (q == root) { under = 1; break }; q = parent[q] }
        if (!under) continue
        m = split(args[p], a, " ")
        what = ""; tool = ""
        for (j = 1; j < m; j++) {
          if (a[j] ~ /\/compile$/ || a[j] == "compile") tool = "go"
          if (a[j] == "-p" && tool == "go") { what = a[j + 1]; break }
          if (a[j] == "--crate-name") { what = a[j + 1]; break }
        }
        if (what != "" && what != "main" && what !~ /^build_script/ && n < 3) { list = list (n ? ", " : "") what; n++ }
      }
      print list
    }'
}

progress_ticker() { # name typical log start parent
  local name=$1 typical=$2 log=$3 start=$4 parent=$5 tty=0 next=10 now what line
  [[ -t 2 ]] && tty=1
  while sleep 2; do
    now=$((SECONDS - start))
    ((now >= next)) || continue
    ((tty)) && next=$((now + 2)) || next=$((now + 30))
    what=$(progress_compiling "$parent" || true)
    if [[ -n "$what" ]]; then
      what="compiling $what"
    else
      line=$(tail -n 1 "$log" 2>/dev/null | tr -d '\r' | cut -c1-90 || true)
      what=${line:-working}
    fi
    line="[$name] $(progress_elapsed "$now") (typically $(progress_elapsed "$typical") on 2 cores): $what"
    if ((tty)); then
      printf '\r\033[K%s' "${line:0:$((${COLUMNS:-120} - 1))}" >&2
    else
      printf '%s\n' "$line" >&2
    fi
  done
}

progress_start() { # name typical log -> sets progress_pid, progress_t0
  mkdir -p "$(dirname "$3")"
  : >"$3"
  progress_t0=$SECONDS
  local parent=$BASHPID
  progress_ticker "$1" "$2" "$3" "$SECONDS" "$parent" &
  progress_pid=$!
}

progress_end() { # name typical log rc
  local name=$1 typical=$2 log=$3 rc=$4 took=$((SECONDS - progress_t0))
  kill "$progress_pid" 2>/dev/null || true
  wait "$progress_pid" 2>/dev/null || true
  [[ -t 2 ]] && ((took >= 10)) && printf '\r\033[K' >&2
  if ((rc != 0)); then
    printf '[%s] failed after %s (exit %d); the last 40 lines of %s:\n' "$name" "$(progress_elapsed "$took")" "$rc" "$log" >&2
    tail -n 40 "$log" >&2
  elif ((took >= 10)); then
    printf '[%s] done in %s (typically %s; log: %s)\n' "$name" "$(progress_elapsed "$took")" \
      "$(progress_elapsed "$typical")" "$log" >&2
  fi
  return "$rc"
}

# CMD runs in a subshell with errexit on, so a shell function given as CMD stops at its first
# failing command, as it would outside (unless progress_run itself is called under if, || or &&,
# where bash ignores errexit throughout).
progress_exec() { # quiet name typical log cmd...
  local quiet=$1 name=$2 typical=$3 log=$4 rc errexit=0
  shift 4
  [[ $- == *e* ]] && errexit=1
  progress_start "$name" "$typical" "$log"
  set +e
  if ((quiet)); then
    (set -e; "$@") >>"$log" 2>&1
  else
    (set -e; "$@") 2>>"$log"
  fi
  rc=$?
  ((errexit)) && set -e
  progress_end "$name" "$typical" "$log" "$rc"
}

progress_run() { progress_exec 0 "$@"; }
progress_run_quiet() { progress_exec 1 "$@"; }
