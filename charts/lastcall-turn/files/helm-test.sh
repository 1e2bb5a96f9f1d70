# `helm test`: the release answers. Run by bash in the server's image (templates/tests/pod.yaml);
# tests/charts/test_helm_test_hook.py runs this file against the built server.
#   HOST, ADMIN_PORT: GET /readyz must answer 200 (the headless Service: a ready server);
#   TURN_PORT, TRANSPORT (tcp | udp): a STUN Binding request (RFC 8489, no credentials needed)
#     must get a Binding success response (message type 0x0101).
set -euo pipefail

exec 3<>"/dev/tcp/$HOST/$ADMIN_PORT"
printf 'GET /readyz HTTP/1.0\r\nHost: %s\r\n\r\n' "$HOST" >&3
line=""
IFS= read -r -t 10 line <&3 || true
exec 3<&-
line=${line%$'\r'}
line=${line#* }
got=${line%% *}
echo "GET http://$HOST:$ADMIN_PORT/readyz: ${got:-no answer}"
[ "$got" = 200 ]

exec 4<>"/dev/$TRANSPORT/$HOST/$TURN_PORT"
# Binding request: type 0x0001, length 0, magic cookie, a 12-byte transaction id.
printf '\x00\x01\x00\x00\x21\x12\xa4\x42lastcalltest' >&4
type=$(timeout 10 head -c 2 <&4 | od -An -tx1 | tr -d ' \n')
exec 4<&-
echo "STUN Binding request to $TRANSPORT $HOST:$TURN_PORT: answer type ${type:-none} (0101: success)"
[ "$type" = 0101 ]
