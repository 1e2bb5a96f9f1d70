# `helm test`: the release answers. Run by bash in the agent's image (templates/tests/pod.yaml);
# tests/charts/test_helm_test_hook.py runs this file against the built agent.
#   HOST, ADMIN_PORT: GET /readyz must answer 200;
#   SPOP_PORT (standalone): a HAPROXY-HELLO as HAProxy's `option spop-check` sends it
#     (healthcheck, SPOP 2.0, max-frame-size 16380) must get an AGENT-HELLO (frame type 101);
#   HTTP_PORT (sidecar): a request with an XSS payload through HAProxy must be denied (403),
#     which only an agent that evaluated it answers (no verdict is 500: fail-closed).
set -euo pipefail

status() {  # host port path: the HTTP status code
  exec 3<>"/dev/tcp/$1/$2"
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$3" "$1" >&3
  local line=""
  IFS= read -r -t 10 line <&3 || true
  exec 3<&-
  line=${line%$'\r'}
  line=${line#* }
  printf '%s' "${line%% *}"
}

got=$(status "$HOST" "$ADMIN_PORT" /readyz)
echo "GET http://$HOST:$ADMIN_PORT/readyz: ${got:-no answer}"
[ "$got" = 200 ]

if [ -n "${SPOP_PORT:-}" ]; then
  exec 4<>"/dev/tcp/$HOST/$SPOP_PORT"
  printf '\x00\x00\x00\x4e\x01\x00\x00\x00\x01\x00\x00\x12supported-versions\x08\x032.0\x0emax-frame-size\x03\xfc\xf0\x06\x0ccapabilities\x08\x00\x0bhealthcheck\x11' >&4
  kind=$(timeout 10 head -c 5 <&4 | od -An -tu1 | awk '{print $5}')
  exec 4<&-
  echo "SPOP HAPROXY-HELLO to $HOST:$SPOP_PORT: frame type ${kind:-none} (101: AGENT-HELLO)"
  [ "$kind" = 101 ]
else
  got=$(status "$HOST" "$HTTP_PORT" '/?q=%3Cscript%3Ealert(1)%3C%2Fscript%3E')
  echo "GET http://$HOST:$HTTP_PORT/?q=<script>...: ${got:-no answer} (403: denied by the WAF)"
  [ "$got" = 403 ]
fi
