#!/usr/bin/env bash
# Install the EMPO2 systemd units on this host (run as root from the repository root).
#   deploy/systemd/install.sh [/opt/empo2]
# Then: edit /etc/empo2/empo2.env (mode 600: it holds the learner token), enable the roles this
# host runs, start empo2.target.
set -euo pipefail
prefix=${1:-/opt/empo2}
here=$(cd "$(dirname "$0")" && pwd)
if [[ $(realpath "$here/../..") != $(realpath -m "$prefix") ]]; then
  mkdir -p "$prefix" && cp -a "$here/../.." "$prefix.tmp" && rm -rf "$prefix" && mv "$prefix.tmp" "$prefix"
fi
(cd "$prefix" && bash scripts/setup.sh)
install -d /etc/empo2
[[ -f /etc/empo2/empo2.env ]] || install -m 0600 "$here/empo2.env.example" /etc/empo2/empo2.env
"$here/learner_token.sh" /etc/empo2/empo2.env  # secure by default: mode 600, a random learner token
# CURVE keys for a deployment off loopback (the two-host line of empo2.env): made once, kept after
[[ -f /etc/empo2/keys/server.key ]] || "$prefix/.venv/bin/empo2-keys" /etc/empo2/keys >/dev/null
chmod -R go-rwx /etc/empo2/keys
for unit in "$here"/*.service "$here"/*.target; do
  sed "s#/opt/empo2#$prefix#g" "$unit" > "/etc/systemd/system/$(basename "$unit")"
done
systemctl daemon-reload
echo "installed; e.g.: systemctl enable empo2-policy-server@0 empo2-memory-service empo2-replay-buffer empo2-env-actor@0 empo2-env-actor@1 empo2-learner && systemctl start empo2.target"
