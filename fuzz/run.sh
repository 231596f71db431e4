#!/usr/bin/env bash
# Builds every fuzz target, then runs each one for SECONDS (default 60).
#
#   fuzz/run.sh 60
#
# Installs cargo-fuzz if it is missing (`cargo install cargo-fuzz --locked`) and uses the
# nightly toolchain, installing it with rustup if needed.
# The committed seeds in corpus/<target>/ are read, never written: what libFuzzer finds
# goes to target/corpus/<target>/, crashes to artifacts/<target>/. Exits non-zero on the
# first target that finds a crash, a leak, a timeout or an out-of-memory.
set -euo pipefail

seconds="${1:-60}"
cd "$(dirname "$0")"

if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

cargo +nightly fuzz build
# For a run of a minute or more, `commands` also gets a build of its own, without
# AddressSanitizer, without comparison tracing and without debug assertions (overflow
# checks stay on), and runs that one: its executions are engine opens, commits and closes
# in safe Rust, where the sanitizer and the comparison hooks cost most of the time and
# find nothing, and redb's debug assertions walk every page of both files at each open
# (fuzz/README.md). A shorter run (CI's 20 s) uses the build above: the second build
# takes about three minutes, more than its faster executions gain in that time.
commands_build=()
commands_env=(env)
if [ "$seconds" -ge 60 ]; then
    commands_build=(-O -s none --no-trace-compares --features mimalloc --target-dir target/commands)
    commands_env=(env "RUSTFLAGS=${RUSTFLAGS:-} -Coverflow-checks=on")
    "${commands_env[@]}" cargo +nightly fuzz build "${commands_build[@]}" commands
fi
for target in $(cargo +nightly fuzz list); do
    build=()
    run_env=(env)
    mkdir -p "target/corpus/$target" "corpus/$target" "artifacts/$target"
    flags=(-max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1)
    if [ "$target" = decode_record ]; then
        # The decoders run under a 64 KiB limit: no allocation may come near 64 MiB.
        flags+=(-malloc_limit_mb=64 -max_len=8192)
    fi
    if [ "$target" = commands ]; then
        # Each input is a list of steps (a few bytes each): room for hundreds of commands.
        # The entropic schedule's bookkeeping costs more than it gains here (fuzz/README.md).
        flags+=(-max_len=4096 -entropic=0)
        build=(${commands_build[@]+"${commands_build[@]}"})
        run_env=("${commands_env[@]}")
    fi
    if [ "$target" = open_damaged ]; then
        # An input is a list of up to 16 edits of about ten bytes each, and each execution
        # opens, queries and rebuilds a database (tens a second): libFuzzer's slow growth
        # of the length limit kept inputs at their seeds' one or two edits for minutes.
        flags+=(-len_control=0 -max_len=512)
    fi
    if [ "$target" = verify_tampered ]; then
        # Each input is a list of tamperings: let lists grow long from the start.
        flags+=(-len_control=0 -max_len=1024)
    fi
    echo "== $target: ${seconds}s"
    "${run_env[@]}" cargo +nightly fuzz run ${build[@]+"${build[@]}"} "$target" "target/corpus/$target" "corpus/$target" -- "${flags[@]}"
done
