#!/usr/bin/env bash
# Host-side build of what tests/vm/suites/35-libgdrapi.sh runs inside the VM (the guest sees the
# repository read-only and has no cargo cache of its own). Called from tests/vm/build-host.sh:
#   bash libgdrapi/tests/vm-build.sh
# Produces, under target/vmstage (STAGE):
#   bin/gdrapi-tests/<name>   the libgdrapi integration-test executables (cargo test --no-run)
#   gdrapi-compat/            the compat-tests/gdrapi consumer programs (built here; the abi
#                             tier runs the whole compat suite on the host)
# and makes sure NCCL's wheel is unpacked in .deps/nccl for the NCCL consumer run in the guest.
set -euo pipefail

REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$REPO"
STAGE=${STAGE:-$REPO/target/vmstage}
say() { printf '[build-host gdrapi] %s\n' "$*"; }

say "cargo test --release -p gdrapi --no-run"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cargo test --release -p gdrapi --no-run --message-format=json-render-diagnostics >"$out"
rm -rf "$STAGE/bin/gdrapi-tests"
mkdir -p "$STAGE/bin/gdrapi-tests"
python3 - "$out" "$STAGE/bin/gdrapi-tests" <<'PY'
import json, os, sys
dest = sys.argv[2]
n = 0
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    if not m.get("profile", {}).get("test"):
        continue
    # integration tests only (the unit tests need no device and run on the host)
    if "test" not in t["kind"]:
        continue
    name = t["name"]
    os.symlink(m["executable"], os.path.join(dest, name))
    n += 1
if n == 0:
    sys.exit("no test executables found in cargo's output")
print(f"[build-host gdrapi] staged {n} test executables")
PY

say "compat-tests/gdrapi consumer programs for the guest"
rm -rf "$STAGE/gdrapi-compat"
compat-tests/gdrapi/run.sh --work "$STAGE/gdrapi-compat" --build-only >"$STAGE/gdrapi-compat.log" 2>&1 ||
    { say "building the consumer programs failed (see $STAGE/gdrapi-compat.log)"; exit 1; }
for b in consumer_dlopen consumer_linked consumer_static; do
    [ -x "$STAGE/gdrapi-compat/$b" ] || { say "missing $STAGE/gdrapi-compat/$b"; exit 1; }
done

if [ ! -f .deps/nccl/nvidia/nccl/lib/libnccl.so.2 ]; then
    say "fetching NCCL for the consumer test (compat-tests/gdrapi/nccl-consumer.sh)"
    compat-tests/gdrapi/nccl-consumer.sh >"$STAGE/gdrapi-nccl-host.log" 2>&1 ||
        say "warning: host NCCL run failed (see $STAGE/gdrapi-nccl-host.log)"
fi
