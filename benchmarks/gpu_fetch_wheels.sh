#!/usr/bin/env bash
# Kept at this path, which the project's instructions name: the script is benchmarks/gpu/fetch_wheels.sh.
exec bash "$(dirname "$0")/gpu/fetch_wheels.sh" "$@"
