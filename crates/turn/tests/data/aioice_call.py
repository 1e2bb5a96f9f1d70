"""A call through a TURN server with aioice's TURN client (UDP): it allocates, binds a channel
to the echo peer on its first send, sends N numbered datagrams 2 ms apart and counts the
echoes. Prints one JSON line: {"sent": N, "got": M}.

Usage: python3 aioice_call.py SERVER_PORT PEER_PORT USERNAME PASSWORD N
"""
import asyncio
import json
import sys

from aioice.turn import create_turn_endpoint


async def main(server_port, peer_port, username, password, n):
    got = set()
    done = asyncio.Event()

    class Echoes(asyncio.DatagramProtocol):
        def datagram_received(self, data, addr):
            if data[:1] == b"m":
                got.add(int(data[1:9]))
                if len(got) == n:
                    done.set()

    transport, _ = await create_turn_endpoint(
        Echoes, server_addr=("127.0.0.1", server_port), username=username, password=password,
        lifetime=600)
    peer = ("127.0.0.1", peer_port)
    for i in range(n):
        transport.sendto(b"m%08d" % i + bytes(100), peer)
        await asyncio.sleep(0.002)
    try:
        await asyncio.wait_for(done.wait(), 10)
    except asyncio.TimeoutError:
        pass
    print(json.dumps({"sent": n, "got": len(got)}), flush=True)
    transport.close()
    await asyncio.sleep(0.1)


if __name__ == "__main__":
    s, p, u, w, n = sys.argv[1:6]
    asyncio.run(main(int(s), int(p), u, w, int(n)))
