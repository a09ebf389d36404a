#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Host-side staging of the Debian packages for the VM suite tests/vm/suites/70-packages.sh,
# called by tests/vm/build-host.sh (STAGE = target/vmstage). Uses target/packages/deb when its
# packages are newer than every tracked source file, else builds them (packaging/build-debs,
# about a minute). Debug-symbol packages are not staged.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/.." && pwd)}
STAGE=${STAGE:-$REPO/target/vmstage}
cd "$REPO"
built=target/packages/deb
stamp=$(ls "$built"/gdrdrv-dkms_*.deb 2>/dev/null | head -n1 || true)
stale=yes
if [ -n "$stamp" ]; then
	stale=no
	while IFS= read -r -d '' f; do
		if [ -f "$f" ] && [ "$f" -nt "$stamp" ]; then stale="yes ($f is newer)"; break; fi
	done < <(git ls-files -z --cached --others --exclude-standard)
fi
if [ "$stale" != no ]; then
	echo "[vm-stage-debs] packages missing or stale: $stale; running packaging/build-debs"
	packaging/build-debs "$built"
fi
rm -rf "$STAGE/debs"
mkdir -p "$STAGE/debs"
find "$built" -maxdepth 1 -name '*.deb' ! -name '*-dbgsym_*' -exec cp {} "$STAGE/debs/" \;
echo "[vm-stage-debs] staged: $(cd "$STAGE/debs" && ls | tr '\n' ' ')"
