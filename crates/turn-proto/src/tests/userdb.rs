//! Keys from a user database, driven as the I/O layer drives them: a request that needs one
//! waits (no answer), its [`Lookup`] comes out of `poll_lookup`, the answer goes to
//! `lookup_done`, and the request comes back out of `poll_replay` to run again. What is kept,
//! for how long, and what a database that is down, slow or swamped costs a client.

use super::*;

/// Long-term users in a database (coturn's `turnusers_lt`), besides the static alice and bob.
fn users_config(limits: CacheLimits) -> ServerConfig {
    let mut c = base_config();
    c.auth.rest_secrets.clear();
    c.auth.database = Some(UserDatabase {
        keys: DatabaseKeys::Users,
        cache: limits,
    });
    c
}

/// TURN REST API secrets in a database only (coturn's `turn_secret`).
fn rest_config() -> ServerConfig {
    let mut c = base_config();
    c.auth.users.clear();
    c.auth.rest_secrets.clear();
    c.auth.database = Some(UserDatabase {
        keys: DatabaseKeys::RestSecrets,
        cache: CacheLimits::default(),
    });
    c
}

fn carol() -> Creds {
    Creds::password("carol", "carolpass")
}

fn key(user: &str, pass: &str) -> [u8; 16] {
    long_term_key(user, REALM, pass)
}

impl H {
    fn lookups(&mut self) -> Vec<Lookup> {
        std::iter::from_fn(|| self.server.poll_lookup()).collect()
    }

    /// Runs every request waiting to be replayed; what each produced (relay sockets bound
    /// at once, as the I/O layer does).
    fn replays(&mut self) -> Vec<Option<Sent>> {
        let mut sent = Vec::new();
        while let Some(r) = self.server.poll_replay() {
            let out = match self
                .server
                .replay(self.now, r.client, &r.data, &mut self.out)
            {
                Some(Output::BindRelay(req)) => {
                    let answer = self.relays.bind(&req);
                    self.server
                        .relay_bound(self.now, answer, &mut self.out)
                        .map(Sent::of)
                }
                Some(Output::Transmit(t)) => Some(Sent::of(t)),
                None => None,
            };
            sent.push(out);
        }
        self.collect_releases();
        sent
    }

    fn advance_ms(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        self.server.handle_timeout(self.now);
        self.collect_releases();
    }

    /// An authenticated Allocate that must wait for a lookup; returns the lookup.
    fn allocate_waits(&mut self, from: ClientAddr, c: &Creds) -> Lookup {
        let nonce = self.nonce(from);
        let req = Req::new(method::ALLOCATE).transport_udp().auth(c, &nonce);
        assert!(
            self.client(from, &req.bytes()).is_none(),
            "answered before the lookup"
        );
        let mut l = self.lookups();
        assert_eq!(l.len(), 1, "{l:?}");
        l.remove(0)
    }

    /// The replayed Allocate's response.
    fn replayed(&mut self) -> Resp {
        let mut r = self.replays();
        assert_eq!(r.len(), 1);
        decode(&r.remove(0).expect("a response"))
    }
}

#[test]
fn an_unknown_user_is_looked_up_once_and_the_request_answered_when_the_key_comes() {
    let mut h = H::new(users_config(CacheLimits::default()));
    let from = udp("192.0.2.7:40000");
    let l = h.allocate_waits(from, &carol());
    assert_eq!(l.realm, REALM);
    assert_eq!(l.query, Query::UserKey("carol".into()));
    assert!(h.server.poll_replay().is_none(), "nothing to replay yet");
    h.server
        .lookup_done(h.now, l.id, Answer::Key(key("carol", "carolpass")));
    let r = h.replayed();
    assert_eq!(r.class, Class::Success, "{:?}", r.code);
    assert!(r.get(attr::MESSAGE_INTEGRITY).is_some());
    // The next client of carol's: answered from what was kept, no lookup.
    let other = udp("192.0.2.8:40000");
    h.allocate(other, &carol());
    assert!(h.lookups().is_empty());
    let c = h.server.counters();
    assert_eq!((c.userdb_lookups, c.userdb_cached), (1, 1));
    // Static users never reach the database.
    h.allocate(udp("192.0.2.9:40000"), &alice());
    assert!(h.lookups().is_empty());
}

#[test]
fn a_retransmission_while_waiting_starts_no_second_lookup_and_is_answered_once() {
    let mut h = H::new(users_config(CacheLimits::default()));
    let from = udp("192.0.2.7:40000");
    let nonce = h.nonce(from);
    let req = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&carol(), &nonce)
        .bytes();
    assert!(h.client(from, &req).is_none());
    assert!(h.client(from, &req).is_none(), "the retransmission");
    let l = h.lookups();
    assert_eq!(l.len(), 1);
    h.server
        .lookup_done(h.now, l[0].id, Answer::Key(key("carol", "carolpass")));
    assert_eq!(h.replays().len(), 1);
}

/// What the next Allocate gets after each database answer, and whether it asked again.
#[test]
fn what_is_kept_and_when_it_is_asked_again() {
    let mut h = H::new(users_config(CacheLimits::default()));
    // No such user: 401; asked again only once the answer is a second old.
    let l = h.allocate_waits(udp("192.0.2.7:1"), &carol());
    h.server.lookup_done(h.now, l.id, Answer::NoUser);
    assert_eq!(h.replayed().code, Some(401));
    let r = h.authed(
        udp("192.0.2.7:2"),
        &carol(),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
    assert!(h.lookups().is_empty(), "asked again within a second");
    h.advance_ms(1000);
    // The user was added meanwhile: found at the next lookup.
    let l = h.allocate_waits(udp("192.0.2.7:3"), &carol());
    h.server
        .lookup_done(h.now, l.id, Answer::Key(key("carol", "carolpass")));
    assert_eq!(h.replayed().class, Class::Success);
    // The password changed: the kept key does not verify, asked again (a second on).
    h.advance_ms(1000);
    let new = Creds::password("carol", "newpass");
    let l = h.allocate_waits(udp("192.0.2.7:4"), &new);
    h.server
        .lookup_done(h.now, l.id, Answer::Key(key("carol", "newpass")));
    assert_eq!(h.replayed().class, Class::Success);
    // The old password right after: the kept (new) key says no, within a second no lookup.
    let r = h.authed(
        udp("192.0.2.7:5"),
        &carol(),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
    assert!(h.lookups().is_empty());
    // Removed from the database: the kept key works until the TTL (10 s), then it is gone.
    h.advance_ms(9_000);
    h.allocate(udp("192.0.2.7:6"), &new);
    assert!(h.lookups().is_empty(), "within the TTL");
    h.advance_ms(1_000);
    let l = h.allocate_waits(udp("192.0.2.7:7"), &new);
    h.server.lookup_done(h.now, l.id, Answer::NoUser);
    assert_eq!(h.replayed().code, Some(401));
    let failures: Vec<AuthFailure> = h
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::AuthFailed { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert!(failures.contains(&AuthFailure::UnknownUser), "{failures:?}");
    assert!(
        failures.contains(&AuthFailure::BadIntegrity),
        "{failures:?}"
    );
}

#[test]
fn a_database_that_is_down_costs_new_allocations_a_500_and_existing_ones_nothing() {
    let mut h = H::new(users_config(CacheLimits::default()));
    let from = udp("192.0.2.7:40000");
    let l = h.allocate_waits(from, &carol());
    h.server
        .lookup_done(h.now, l.id, Answer::Key(key("carol", "carolpass")));
    let relay = h.replayed().addr(attr::XOR_RELAYED_ADDRESS).unwrap();
    // Past the TTL the database is down.
    h.advance_ms(11_000);
    let dave = Creds::password("dave", "davepass");
    let l = h.allocate_waits(udp("192.0.2.8:1"), &dave);
    h.server.lookup_done(h.now, l.id, Answer::Unavailable);
    let r = h.replayed();
    assert_eq!(r.code, Some(500), "try again");
    assert!(
        r.raw.len() <= 28 + 8,
        "a bare error, never larger: {}",
        r.raw.len()
    );
    // Carol's allocation refreshes, permits and relays with its own key: no lookup.
    let r = h.authed(from, &carol(), Req::new(method::REFRESH).lifetime(600));
    assert_eq!(r.class, Class::Success, "{:?}", r.code);
    let r = h.authed(
        from,
        &carol(),
        Req::new(method::CREATE_PERMISSION).peer("8.8.8.8:5000"),
    );
    assert_eq!(r.class, Class::Success);
    assert!(h.lookups().is_empty());
    let sent = h.peer(relay, "8.8.8.8:5000".parse().unwrap(), b"media");
    assert!(
        matches!(sent, Some(Sent::Client(to, _)) if to == from),
        "{sent:?} {relay}"
    );
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::AuthFailed {
            reason: AuthFailure::DatabaseUnavailable,
            ..
        }
    )));
    assert_eq!(h.server.counters().userdb_unavailable, 1);
    // Unavailable is asked again a second later: the database is back.
    h.advance_ms(1_000);
    let l = h.allocate_waits(udp("192.0.2.8:2"), &dave);
    h.server
        .lookup_done(h.now, l.id, Answer::Key(key("dave", "davepass")));
    assert_eq!(h.replayed().class, Class::Success);
}

#[test]
fn a_lookup_that_never_comes_back_answers_500_at_its_timeout() {
    let mut h = H::new(users_config(CacheLimits::default()));
    let l = h.allocate_waits(udp("192.0.2.7:1"), &carol());
    assert_eq!(
        h.server.poll_timeout(),
        Some(h.now + Duration::from_secs(3)),
        "the core's own bound on a lookup"
    );
    h.advance_ms(2_999);
    assert!(h.replays().is_empty());
    h.advance_ms(1);
    assert_eq!(h.replayed().code, Some(500));
    assert_eq!(h.server.counters().userdb_unavailable, 1);
    // The answer, too late, changes nothing.
    h.server
        .lookup_done(h.now, l.id, Answer::Key(key("carol", "carolpass")));
    assert!(h.replays().is_empty());
}

#[test]
fn too_many_lookups_or_waiting_requests_get_500_at_once() {
    let limits = CacheLimits {
        lookups: 1,
        waiting: 2,
        ..CacheLimits::default()
    };
    let mut h = H::new(users_config(limits));
    h.allocate_waits(udp("192.0.2.7:1"), &carol());
    // Another user needs a second lookup: busy.
    let r = h.authed(
        udp("192.0.2.7:2"),
        &Creds::password("dave", "x"),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(500));
    // Carol again joins the lookup in flight; a third waiting request is one too many.
    let nonce = h.nonce(udp("192.0.2.7:3"));
    let req = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&carol(), &nonce);
    assert!(h.client(udp("192.0.2.7:3"), &req.bytes()).is_none());
    let r = h.authed(
        udp("192.0.2.7:4"),
        &carol(),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(500));
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::AuthFailed {
            reason: AuthFailure::DatabaseBusy,
            ..
        }
    )));
}

#[test]
fn a_replay_never_waits_twice() {
    // Nothing is kept: the answer is gone by the time the request runs again.
    let limits = CacheLimits {
        entries: 0,
        ..CacheLimits::default()
    };
    let mut h = H::new(users_config(limits));
    let l = h.allocate_waits(udp("192.0.2.7:1"), &carol());
    h.server
        .lookup_done(h.now, l.id, Answer::Key(key("carol", "carolpass")));
    assert_eq!(h.replayed().code, Some(500));
    assert!(h.lookups().is_empty());
}

#[test]
fn only_a_request_with_a_valid_nonce_starts_a_lookup() {
    let mut h = H::new(users_config(CacheLimits::default()));
    let from = udp("192.0.2.7:1");
    // A nonce made for another address (as a spoofed source would have to send).
    let nonce = h.nonce(udp("192.0.2.99:1"));
    let req = Req::new(method::ALLOCATE)
        .transport_udp()
        .auth(&carol(), &nonce);
    let r = decode(&h.client(from, &req.bytes()).unwrap());
    assert_eq!(r.code, Some(438));
    assert!(h.lookups().is_empty());
}

#[test]
fn a_closed_connection_is_not_answered_after_its_lookup() {
    let mut h = H::new(users_config(CacheLimits::default()));
    let mut from = udp("192.0.2.7:1");
    from.transport = Transport::Tcp;
    let l = h.allocate_waits(from, &carol());
    h.server.close_client(h.now, &from);
    h.server
        .lookup_done(h.now, l.id, Answer::Key(key("carol", "carolpass")));
    assert!(h.replays().is_empty());
}

#[test]
fn rest_secrets_from_the_database_rotate_without_a_restart() {
    let mut h = H::new(rest_config());
    let exp = h.unix_now() + 3600;
    let old = Creds::rest(b"old", exp, "alice");
    let new = Creds::rest(b"new", exp, "bob");
    let from = udp("192.0.2.7:1");
    let l = h.allocate_waits(from, &old);
    assert_eq!(l.query, Query::RestSecrets);
    h.server.lookup_done(
        h.now,
        l.id,
        Answer::Secrets(vec![b"old".to_vec(), b"new".to_vec()]),
    );
    let r = h.replayed();
    assert_eq!(r.class, Class::Success);
    assert!(r.lifetime().unwrap() <= 3600);
    h.allocate(udp("192.0.2.7:2"), &new);
    assert!(h.lookups().is_empty(), "one entry for every REST user");
    // "old" rotated out, "newer" in: a credential of "newer" is seen a second later.
    h.advance_ms(1_000);
    let newer = Creds::rest(b"newer", exp, "carol");
    let l = h.allocate_waits(udp("192.0.2.7:3"), &newer);
    h.server.lookup_done(
        h.now,
        l.id,
        Answer::Secrets(vec![b"new".to_vec(), b"newer".to_vec()]),
    );
    assert_eq!(h.replayed().class, Class::Success);
    let r = h.authed(
        udp("192.0.2.7:4"),
        &old,
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401), "the rotated-out secret");
    // Not a REST username at all: nothing to look up.
    let r = h.authed(
        udp("192.0.2.7:5"),
        &carol(),
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
    assert!(h.lookups().is_empty());
}

#[test]
fn static_secrets_are_tried_before_the_database_and_an_expired_credential_never_waits() {
    let mut c = rest_config();
    c.auth.rest_secrets.push(SECRET.to_vec());
    let mut h = H::new(c);
    let exp = h.unix_now() + 600;
    h.allocate(udp("192.0.2.7:1"), &Creds::rest(SECRET, exp, "alice"));
    assert!(h.lookups().is_empty());
    // A credential of another secret: the database's secrets are asked.
    let l = h.allocate_waits(udp("192.0.2.7:2"), &Creds::rest(b"db", exp, "bob"));
    h.server
        .lookup_done(h.now, l.id, Answer::Secrets(vec![b"db".to_vec()]));
    assert_eq!(h.replayed().class, Class::Success);
    // An expired one is refused after its key verifies, as before.
    let past = Creds::rest(b"db", h.unix_now() - 1, "carol");
    let r = h.authed(
        udp("192.0.2.7:3"),
        &past,
        Req::new(method::ALLOCATE).transport_udp(),
    );
    assert_eq!(r.code, Some(401));
}

#[test]
fn zrest_secrets_come_from_the_database_after_the_static_ones() {
    let mut c = rest_config();
    c.auth.rest_scheme = crate::RestScheme::Zrest;
    c.auth.rest_secrets.push(SECRET.to_vec());
    let mut h = H::new(c);
    let zrest =
        |secret: &[u8], name: &str| Creds::password(name, &crate::zrest_password(secret, name));
    let exp = h.unix_now() + 600;
    let name = format!("d={exp}.v=1.k=1.t=s.r=abc");
    // A static secret verifies: the database is not asked.
    h.allocate(udp("192.0.2.7:1"), &zrest(SECRET, &name));
    assert!(h.lookups().is_empty());
    // Another secret: the realm's turn_secret rows are asked, and the second one verifies.
    let l = h.allocate_waits(udp("192.0.2.7:2"), &zrest(b"db2", &name));
    assert_eq!(l.query, Query::RestSecrets);
    h.server.lookup_done(
        h.now,
        l.id,
        Answer::Secrets(vec![b"db1".to_vec(), b"db2".to_vec()]),
    );
    let r = h.replayed();
    assert_eq!(r.class, Class::Success, "{:?}", r.code);
    assert_eq!(r.lifetime(), Some(600), "not capped");
    // Expired, or not of zrest's shape: refused without asking the database.
    for bad in [
        zrest(b"db2", &format!("d={}.v=1.k=1.t=s.r=abc", h.unix_now())),
        Creds::rest(b"db2", exp, "alice"),
        carol(),
    ] {
        let r = h.authed(
            udp("192.0.2.7:3"),
            &bad,
            Req::new(method::ALLOCATE).transport_udp(),
        );
        assert_eq!(r.code, Some(401), "{}", bad.user);
        assert!(h.lookups().is_empty(), "{}", bad.user);
    }
}
