#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Host-side staging of cudasim's test binaries for the VM suite tests/vm/suites/15-cudasim.sh
# (the guest sees the repository read-only and builds nothing). Meant to be called from
# tests/vm/build-host.sh; safe to run by hand:
#
#   bash sim/cudasim/vm-build.sh        # -> target/vmstage/bin/cudasim/{unit,dlopen}
#
# CUDASIM_STAGE_DIR overrides the destination (the VM suite uses it, with CARGO_TARGET_DIR and
# CARGO_HOME in /tmp, to build in the guest when the host did not stage the binaries).
set -euo pipefail

REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$REPO"
DEST=${CUDASIM_STAGE_DIR:-${STAGE:-$REPO/target/vmstage}/bin/cudasim}
mkdir -p "$DEST"

# CUDASIM_STANDALONE=1: build a copy of the crate outside the workspace. cudasim has no
# dependencies, so this works offline with an empty CARGO_HOME (the workspace's other members
# need crates from the registry, which a guest may not have).
if [ "${CUDASIM_STANDALONE:-0}" = 1 ]; then
	src=$(mktemp -d /tmp/cudasim-src.XXXXXX)
	cp -r "$REPO/sim/cudasim/." "$src/"
	sed -i -e 's/^edition.workspace = true/edition = "2024"/' \
		-e 's/^license.workspace = true/license = "MIT"/' \
		-e '/^\[lints\]/,$d' "$src/Cargo.toml"
	printf '\n[workspace]\n' >> "$src/Cargo.toml"
	cd "$src"
fi

# The test executables' names carry a hash: take them from cargo's JSON messages.
exes=$(cargo test --release -p cudasim --no-run --message-format=json ${CUDASIM_CARGO_FLAGS:-} |
	python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        print(m["target"]["name"] + " " + m["executable"])
')
[ -n "$exes" ] || { echo "vm-build: cargo test --no-run produced no test executables" >&2; exit 1; }
while read -r name exe; do
	case $name in
	cuda) cp -f "$exe" "$DEST/unit" ;;
	dlopen) cp -f "$exe" "$DEST/dlopen" ;;
	esac
done <<< "$exes"
[ -x "$DEST/unit" ] && [ -x "$DEST/dlopen" ] || { echo "vm-build: unit/dlopen test binaries missing" >&2; exit 1; }
echo "[cudasim vm-build] staged $(ls "$DEST" | tr '\n' ' ')in $DEST"
