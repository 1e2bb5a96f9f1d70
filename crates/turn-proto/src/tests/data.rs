//! Send and Data indications and ChannelData (RFC 8656 §10, §12), both ways: permissions,
//! padding for TCP/TLS, stream framing, `max-bps`.

use super::*;

#[test]
fn full_round_trip_udp() {
    let mut h = H::new(base_config());
    let from = udp("192.0.2.7:40000");
    let relay = h.allocate(from, &alice());
    let peer: SocketAddr = "8.8.8.8:5000".parse().unwrap();
    // No permission yet: peer data dropped, Send dropped.
    assert_eq!(h.peer(relay, peer, b"early"), None);
    let send = Req::indication(method::SEND)
        .peer("8.8.8.8:5000")
        .attr(attr::DATA, b"via send".to_vec())
        .bytes();
    assert_eq!(h.client(from, &send), None);
    assert_eq!(h.server.counters().peer_dropped, 1);
    // CreatePermission, then Send goes out and peer data comes back as a Data indication.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:5000"),
    );
    assert_eq!(r.class, Class::Success);
    assert_eq!(
        h.client(from, &send),
        Some(Sent::Peer(relay, peer, b"via send".to_vec()))
    );
    let d = decode(&h.peer(relay, peer, b"hello").unwrap());
    assert_eq!((d.class, d.method), (Class::Indication, method::DATA));
    assert_eq!(d.addr(attr::XOR_PEER_ADDRESS), Some(peer));
    assert_eq!(d.get(attr::DATA), Some(&b"hello"[..]));
    // Permissions are per IP: another port of the same peer IP passes.
    assert!(h
        .peer(relay, "8.8.8.8:6000".parse().unwrap(), b"x")
        .is_some());
    // ChannelBind, then ChannelData both ways.
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    assert_eq!(r.class, Class::Success);
    let cd = [0x40, 0x01, 0x00, 0x03, b'a', b'b', b'c'];
    assert_eq!(
        h.client(from, &cd),
        Some(Sent::Peer(relay, peer, b"abc".to_vec()))
    );
    // Over UDP, padding after the payload is accepted.
    let cd_padded = [0x40, 0x01, 0x00, 0x03, b'a', b'b', b'c', 0];
    assert_eq!(
        h.client(from, &cd_padded),
        Some(Sent::Peer(relay, peer, b"abc".to_vec()))
    );
    assert_eq!(
        h.peer(relay, peer, b"xyz"),
        Some(Sent::Client(
            from,
            vec![0x40, 0x01, 0x00, 0x03, b'x', b'y', b'z']
        ))
    );
    // Unbound channel or truncated ChannelData: dropped.
    assert_eq!(h.client(from, &[0x40, 0x02, 0x00, 0x01, b'a']), None);
    assert_eq!(h.client(from, &[0x40, 0x01, 0x00, 0x09, b'a']), None);
    // Another client cannot use this allocation's channel.
    assert_eq!(h.client(udp("192.0.2.9:1"), &cd), None);
    let c = *h.server.counters();
    assert_eq!(c.peer_packets_out, 3);
    assert!(c.client_data_dropped >= 3);
}

#[test]
fn tcp_channel_data_is_padded_and_close_deletes() {
    let mut h = H::new(base_config());
    let from = ClientAddr {
        transport: Transport::Tcp,
        client: "192.0.2.7:40000".parse().unwrap(),
        local: "198.51.100.1:3478".parse().unwrap(),
    };
    let relay = h.allocate(from, &alice());
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    assert_eq!(r.class, Class::Success);
    let got = h
        .peer(relay, "8.8.8.8:5000".parse().unwrap(), b"hello")
        .unwrap();
    assert_eq!(
        got,
        Sent::Client(
            from,
            vec![0x40, 0x01, 0x00, 0x05, b'h', b'e', b'l', b'l', b'o', 0, 0, 0]
        )
    );
    h.events();
    h.server.close_client(h.now, &from);
    h.collect_releases();
    assert_eq!(h.server.allocation_count(), 0);
    assert_eq!(h.relays.released, vec![relay]);
    assert!(matches!(
        &h.events()[..],
        [Event::AllocationDeleted {
            reason: DeleteReason::ConnectionClosed,
            ..
        }]
    ));
}

#[test]
fn peer_data_for_unknown_relay_is_dropped() {
    let mut h = H::new(base_config());
    assert_eq!(
        h.peer(
            "203.0.113.10:1".parse().unwrap(),
            "8.8.8.8:1".parse().unwrap(),
            b"x"
        ),
        None
    );
    assert_eq!(h.server.counters().peer_dropped, 1);
}

/// A TCP byte stream cut at every possible point: frames come out whole, in order, and the
/// server answers each (Binding, then ChannelData to the peer).
#[test]
fn tcp_stream_framing_end_to_end() {
    let mut h = H::new(base_config());
    let from = ClientAddr {
        transport: Transport::Tcp,
        client: "192.0.2.7:40000".parse().unwrap(),
        local: "198.51.100.1:3478".parse().unwrap(),
    };
    let relay = h.allocate(from, &alice());
    h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4001)
            .peer("8.8.8.8:5000"),
    );
    let mut stream = Req::new(method::BINDING).bytes();
    stream.extend_from_slice(&[
        0x40, 0x01, 0x00, 0x05, b'h', b'e', b'l', b'l', b'o', 0, 0, 0,
    ]);
    stream.extend_from_slice(&Req::new(method::BINDING).fp().bytes());
    for cut in 1..stream.len() {
        let mut buf: Vec<u8> = Vec::new();
        let mut got = Vec::new();
        for chunk in [&stream[..cut], &stream[cut..]] {
            buf.extend_from_slice(chunk);
            while let Ok(Some(n)) = stream_frame_len(&buf) {
                let frame: Vec<u8> = buf.drain(..n).collect();
                got.push(h.client(from, &frame).expect("an answer per frame"));
            }
            assert!(stream_frame_len(&buf).is_ok());
        }
        assert!(buf.is_empty());
        assert_eq!(got.len(), 3, "cut at {cut}");
        assert_eq!(
            got[1],
            Sent::Peer(relay, "8.8.8.8:5000".parse().unwrap(), b"hello".to_vec())
        );
        assert_eq!(
            decode(&got[2]).addr(attr::XOR_MAPPED_ADDRESS),
            Some(from.client)
        );
    }
}

/// An allocation with a channel 0x4000 to 8.8.8.8:5000; returns its relay.
fn with_channel(h: &mut H, from: ClientAddr) -> SocketAddr {
    let relay = h.allocate(from, &alice());
    let r = h.authed(
        from,
        &alice(),
        Req::new(method::CHANNEL_BIND)
            .channel(0x4000)
            .peer("8.8.8.8:5000"),
    );
    assert_eq!(r.class, Class::Success);
    relay
}

fn channel_data(payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0x40, 0x00];
    v.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

#[test]
fn max_bps_holds_each_direction_to_its_rate_over_a_paused_clock() {
    let mut c = base_config();
    c.bandwidth.max_bps = 10_000;
    let mut h = H::new(c);
    let from = udp("192.0.2.7:40000");
    let relay = with_channel(&mut h, from);
    let peer: SocketAddr = "8.8.8.8:5000".parse().unwrap();
    let payload = [7u8; 100];
    // 10 s at twice the rate: 200 datagrams of 100 bytes a second, each way.
    let (mut up, mut down) = (0u64, 0u64);
    for _ in 0..2000 {
        h.now += Duration::from_millis(5);
        if h.client(from, &channel_data(&payload)).is_some() {
            up += 100;
        }
        if h.peer(relay, peer, &payload).is_some() {
            down += 100;
        }
    }
    // One second's burst, then the rate: 10 kB + 10 s x 10 kB/s.
    for (what, got) in [("up", up), ("down", down)] {
        assert!((105_000..=111_000).contains(&got), "{what}: {got}");
    }
    assert!(h.server.counters().bandwidth_dropped >= 1800);
}
