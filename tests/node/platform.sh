#!/usr/bin/env bash
# This machine's platform as images name it (the real node runs it): linux/amd64 or linux/arm64.
case $(uname -m) in
x86_64) echo linux/amd64 ;;
aarch64 | arm64) echo linux/arm64 ;;
*) echo "platform.sh: no drafs image for $(uname -m)" >&2; exit 1 ;;
esac
