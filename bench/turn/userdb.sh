#!/usr/bin/env bash
# Allocations per second of lastcall-turn with each user database coturn reads (SQLite,
# PostgreSQL, Redis) and, for reference, with the same credentials in turnserver.conf
# (`user=` lines, `static-auth-secret`). docs/benchmarks.md (*User databases*) has the table
# and the command; run it on an idle machine:
#
#   bash bench/turn/userdb.sh [COUNT] [ROUNDS]      # default 2000 allocations, 3 rounds
#
# Each measurement is a fresh lastcall-turn (release build) on free loopback ports and
# `lastcall-turnload hold --count COUNT --concurrency 16`: COUNT client sockets, each doing
# what a real client does (Allocate, 401, authenticated Allocate), 16 in flight; every client
# is on 127.0.0.1, so the per-source limit on challenges is off (--unauthorized-ratelimit-rps=0:
# at its default, 100/s, one address gets 100 allocations a second). Three kinds
# of credentials:
#   one user      every allocation is user0 (after the first, answered from what the server
#                 kept of the database: the cache)
#   COUNT users   allocation i is user<i>: every one needs a lookup (the cache never helps)
#   REST          TURN REST API credentials, the secret in the database's turn_secret
# The databases: Debian's postgres and redis-server, started here on loopback (as the
# postgres user when root), an SQLite file; users written in bulk with the keys turnadmin
# would write (MD5 of user:realm:password in hex), two of them by turnadmin itself.
# Prints one line per measurement and a Markdown table of the medians.
set -euo pipefail
cd "$(dirname "$0")/../.."
count=${1:-2000}
rounds=${2:-3}
realm=example.org
password=benchpass
secret=benchsecret

cargo build --release --locked -p lastcall-turn -p lastcall-turnload >&2
turn=$PWD/target/release/lastcall-turn
load=$PWD/target/release/lastcall-turnload
ulimit -n 65536 2>/dev/null || true

work=$(mktemp -d "${TMPDIR:-/tmp}/lastcall-userdb-bench.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "nothing on port $1" >&2; return 1; }
key() { printf '%s' "$1:$realm:$password" | md5sum | cut -d' ' -f1; }

# --- the users, as turnadmin stores them -------------------------------------------------
users_sql=$work/users.sql
redis_cmds=$work/users.redis
{
  for i in $(seq 0 $((count - 1))); do
    echo "insert into turnusers_lt (realm, name, hmackey) values ('$realm', 'user$i', '$(key "user$i")');"
  done
  echo "insert into turn_secret (realm, value) values ('$realm', '$secret');"
} >"$users_sql"
{
  for i in $(seq 0 $((count - 1))); do echo "SET turn/realm/$realm/user/user$i/key $(key "user$i")"; done
  echo "SADD turn/realm/$realm/secret $secret"
} >"$redis_cmds"

# SQLite: turnadmin makes the file (coturn's tables), the rest in one transaction.
sqlite=$work/turndb
turnadmin -a -b "$sqlite" -u turnadmin-user -r "$realm" -p "$password" >/dev/null 2>&1
{ echo "begin;"; cat "$users_sql"; echo "commit;"; } | sqlite3 "$sqlite"

# PostgreSQL (Debian's), as the postgres user when root.
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
pgdir=$work/pg
mkdir -p "$pgdir"
echo "turn-db-pw" >"$work/pgpw"
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
  chown -R postgres:postgres "$pgdir" "$work/pgpw"
  chmod 755 "$work"
  as_pg=(setpriv --reuid=postgres --regid=postgres --init-groups)
fi
"${as_pg[@]}" "$pgbin/initdb" -D "$pgdir/data" -U turn --auth=scram-sha-256 --no-sync -E UTF8 --pwfile="$work/pgpw" >/dev/null
pgport=$(free_port)
"${as_pg[@]}" "$pgbin/postgres" -D "$pgdir/data" -p "$pgport" -k "$pgdir" -c listen_addresses=127.0.0.1 -c fsync=off >"$work/pg.log" 2>&1 &
pids+=($!)
wait_port "$pgport"
pg="host=127.0.0.1 port=$pgport dbname=coturn user=turn password=turn-db-pw"
psql() { "$pgbin/psql" "$1" -v ON_ERROR_STOP=1 -q "${@:2}"; }
for _ in $(seq 100); do psql "${pg/dbname=coturn/dbname=postgres}" -c 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
psql "${pg/dbname=coturn/dbname=postgres}" -c 'create database coturn'
psql "$pg" -f /usr/share/coturn/schema.sql
turnadmin -a -e "$pg" -u turnadmin-user -r "$realm" -p "$password" >/dev/null 2>&1
{ echo "begin;"; cat "$users_sql"; echo "commit;"; } | psql "$pg" >/dev/null

# Redis (Debian's).
rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --requirepass turn-db-pw --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
wait_port "$rport"
redis="ip=127.0.0.1 port=$rport dbname=2 password=turn-db-pw"
turnadmin -a -N "$redis" -u turnadmin-user -r "$realm" -p "$password" >/dev/null 2>&1
redis-cli -h 127.0.0.1 -p "$rport" -a turn-db-pw --no-auth-warning -n 2 <"$redis_cmds" >/dev/null

# The reference: the same users as user= lines.
conf=$work/users.conf
for i in $(seq 0 $((count - 1))); do echo "user=user$i:$password"; done >"$conf"

# --- one measurement ---------------------------------------------------------------------
# measure NAME KIND ARGS...: a fresh server with ARGS, one hold run; prints "NAME KIND rate".
measure() {
  local name=$1 kind=$2; shift 2
  local port admin
  port=$(free_port); admin=$(free_port)
  "$turn" -n --listening-ip=127.0.0.1 --relay-ip=127.0.0.1 --listening-port="$port" \
    --min-port=10000 --max-port=31999 --realm=$realm --allow-loopback-peers --no-tls \
    --admin-addr=127.0.0.1:"$admin" --log-level=warn --unauthorized-ratelimit-rps=0 \
    "$@" >"$work/turn.log" 2>&1 &
  local pid=$!
  wait_port "$port"
  local lt=()
  case $kind in
    one-user) lt=(--lt-user user --lt-users 1 --lt-password "$password") ;;
    all-users) lt=(--lt-user user --lt-users "$count" --lt-password "$password") ;;
    rest) lt=() ;;
  esac
  local out
  out=$("$load" --server 127.0.0.1:"$port" --secret "$secret" hold --count "$count" \
    --concurrency 16 --hold 0.2 "${lt[@]}" 2>"$work/load.err")
  out=${out%%$'\n'*}
  kill -QUIT "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local rate failed
  rate=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(round(d["allocs_per_s"]))' "$out")
  failed=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d.get("failed", 0))' "$out")
  echo "$name $kind $rate failed=$failed"
}

results=$work/results
: >"$results"
for round in $(seq "$rounds"); do
  echo "== round $round of $rounds (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  {
    measure static one-user --lt-cred-mech --user="user0:$password"
    measure static all-users --lt-cred-mech -c "$conf"
    measure static rest --use-auth-secret --static-auth-secret="$secret"
    for db in sqlite postgresql redis; do
      case $db in
        sqlite) opt=(--userdb="$sqlite") ;;
        postgresql) opt=(--psql-userdb="$pg") ;;
        redis) opt=(--redis-userdb="$redis") ;;
      esac
      measure "$db" one-user --lt-cred-mech "${opt[@]}"
      measure "$db" all-users --lt-cred-mech "${opt[@]}"
      measure "$db" rest --use-auth-secret "${opt[@]}"
    done
  } | tee -a "$results" >&2
done

python3 - "$results" "$count" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, kind, rate, failed = line.split()
    rows.setdefault((name, kind), []).append((int(rate), failed))
count = sys.argv[2]
kinds = [("one-user", "one user"), ("all-users", f"{count} users"), ("rest", "REST, secret in the database")]
print(f"| credentials | " + " | ".join(k[1] for k in kinds) + " |")
print("|---|" + "---:|" * len(kinds))
ref = {k: statistics.median(r for r, _ in rows[("static", k)]) for k, _ in kinds}
for name, label in [("static", "turnserver.conf (`user=`, `static-auth-secret`)"), ("sqlite", "SQLite (`userdb`)"), ("postgresql", "PostgreSQL (`psql-userdb`)"), ("redis", "Redis (`redis-userdb`)")]:
    cells = []
    for k, _ in kinds:
        rates = [r for r, _ in rows[(name, k)]]
        bad = [f for _, f in rows[(name, k)] if f != "failed=0"]
        med = statistics.median(rates)
        cell = f"{med:,.0f}/s"
        if name != "static":
            cell += f" ({med / ref[k]:.2f}x)"
        if bad:
            cell += " (failures: " + ",".join(bad) + ")"
        cells.append(cell)
    print(f"| {label} | " + " | ".join(cells) + " |")
EOF
