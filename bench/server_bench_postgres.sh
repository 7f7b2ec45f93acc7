#!/bin/sh
# server_bench --store=postgresql://... against a throwaway PostgreSQL 15
# cluster: pg_virtualenv (Debian's postgresql-common) creates it, passes its
# port and password (PGPASSWORD, which libpq reads) and removes it afterwards.
#
#   bench/server_bench_postgres.sh build/bench/server_bench [server_bench flags]
#
# Exits 77 (skipped) when PostgreSQL 15 or pg_virtualenv is not installed.
set -eu
if [ $# -lt 1 ]; then
  echo "usage: $0 SERVER_BENCH [flags]" >&2
  exit 2
fi
if ! command -v pg_virtualenv >/dev/null || [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
  echo "server_bench_postgres: PostgreSQL 15 or pg_virtualenv not installed (Debian: postgresql): skipped"
  exit 77
fi
GAC_SERVER_BENCH=$1
shift
GAC_SERVER_BENCH_FLAGS="$*"
export GAC_SERVER_BENCH GAC_SERVER_BENCH_FLAGS
# shellcheck disable=SC2016  # expanded by the inner shell, inside the cluster's environment
exec pg_virtualenv -v 15 sh -c \
  'exec "$GAC_SERVER_BENCH" $GAC_SERVER_BENCH_FLAGS --store="postgresql://$PGUSER@127.0.0.1:$PGPORT/$PGDATABASE"'
