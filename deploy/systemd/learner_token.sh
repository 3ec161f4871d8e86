#!/usr/bin/env bash
# Give the units' environment file a learner token if it sets none (install.sh runs it):
#   deploy/systemd/learner_token.sh /etc/empo2/empo2.env
# The replay buffer serves batches only to a learner that sends its token (or under CURVE), so units
# started from this file are secure by default: the file is made mode 600, then gets a random
# EMPO2_LEARNER_TOKEN (pipeline/cli.py hands it to every role as security.learner_token) unless it
# already has one, or EMPO2_ARGS sets security.learner_token. Run again, it changes nothing.
set -euo pipefail
env_file=$1
chmod 600 "$env_file"  # before a secret goes in
if grep -Eq '^EMPO2_LEARNER_TOKEN=.+' "$env_file" || grep -Eq '^EMPO2_ARGS=.*security\.learner_token=.+' "$env_file"; then
  exit 0
fi
token=$(head -c 24 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
sed -i '/^EMPO2_LEARNER_TOKEN=/d' "$env_file"  # an empty one
printf '%s\n' \
  "# the learner's token, written by deploy/systemd/learner_token.sh: the buffer's and the learner's hosts share it" \
  "EMPO2_LEARNER_TOKEN=$token" >> "$env_file"
echo "wrote a random EMPO2_LEARNER_TOKEN into $env_file (mode 600)"
