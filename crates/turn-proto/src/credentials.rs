//! Credentials kept outside the configuration (a user database): what the core asks the I/O
//! layer to look up, the answers it keeps, and the requests that wait for one.
//!
//! The core never talks to a database. When a request needs a key the configuration does not
//! have (a long-term user not in `user=`, or, with `use-auth-secret`, the REST secrets kept in
//! the database), the core keeps the request, queues a [`Lookup`] for
//! [`Server::poll_lookup`](crate::Server::poll_lookup) and answers nothing yet. The I/O layer
//! runs the lookup wherever it likes and hands the result to
//! [`Server::lookup_done`](crate::Server::lookup_done); the requests that waited for it come
//! out of [`Server::poll_replay`](crate::Server::poll_replay), for the I/O layer to run
//! again through [`Server::replay`](crate::Server::replay), which now finds the answer here.
//!
//! Everything is bounded ([`CacheLimits`]): the answers kept (entries, and how long each is
//! trusted), the lookups in flight, the requests waiting and their bytes, and how long a
//! lookup may take before its requests get 500 (the I/O layer should give up sooner, with
//! its own timeout, and answer [`Answer::Unavailable`]). Only a request whose NONCE is valid
//! starts a lookup: the nonce is bound to the client's IP address, so a spoofed source never
//! makes the core ask the database anything.
//!
//! How long an answer is trusted: [`CacheLimits::ttl`] for an answer that authenticates the
//! request (a found key that verifies, a secret that verifies); an answer that does not (no
//! such user, a key or secrets that do not verify, the database unavailable) is asked again
//! once it is older than [`CacheLimits::recheck`]. So a user added, a password changed or a
//! secret added in the database works within `recheck`; a user removed or a secret rotated
//! out stops working for new allocations within `ttl`.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::types::ClientAddr;

/// Bounds of what the core keeps of a user database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Answers kept (users, and the REST secrets as one entry); the oldest goes first.
    pub entries: usize,
    /// How long an answer that authenticates requests is used without asking again.
    pub ttl: Duration,
    /// An answer that did not authenticate a request is asked again once it is this old.
    pub recheck: Duration,
    /// A lookup not answered within this long counts as [`Answer::Unavailable`].
    pub lookup_timeout: Duration,
    /// Lookups in flight at once; a request that needs one more gets 500.
    pub lookups: usize,
    /// Requests waiting for lookups, and their bytes together; one more gets 500.
    pub waiting: usize,
    /// See [`waiting`](Self::waiting).
    pub waiting_bytes: usize,
}

impl Default for CacheLimits {
    /// 10,000 entries, 10 s, 1 s, 3 s, 64 lookups, 1,024 requests and 1 MiB waiting.
    fn default() -> Self {
        CacheLimits {
            entries: 10_000,
            ttl: Duration::from_secs(10),
            recheck: Duration::from_secs(1),
            lookup_timeout: Duration::from_secs(3),
            lookups: 64,
            waiting: 1024,
            waiting_bytes: 1 << 20,
        }
    }
}

/// What a [`Lookup`] asks for (always in [`Lookup::realm`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Query {
    /// The long-term key of this user (coturn's `turnusers_lt`, Redis
    /// `turn/realm/REALM/user/NAME/key`).
    UserKey(String),
    /// Every TURN REST API secret of the realm (coturn's `turn_secret`, Redis
    /// `turn/realm/REALM/secret`).
    RestSecrets,
}

/// A lookup for the I/O layer; answer it with [`Server::lookup_done`](crate::Server::lookup_done).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// Copy it into the answer.
    pub id: u64,
    /// The realm (the server's `realm`).
    pub realm: String,
    /// What to look up.
    pub query: Query,
}

/// The I/O layer's answer to a [`Lookup`].
#[derive(Clone, PartialEq, Eq)]
pub enum Answer {
    /// The user's 16-byte long-term key (MD5 of `user:realm:password`, as `turnadmin` stores
    /// it in hex).
    Key([u8; 16]),
    /// No such user in that realm.
    NoUser,
    /// The realm's REST secrets (none is an answer too).
    Secrets(Vec<Vec<u8>>),
    /// The database could not answer (down, slow, an error): the waiting requests get 500.
    Unavailable,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Key(_) => f.write_str("Key(..)"),
            Answer::NoUser => f.write_str("NoUser"),
            Answer::Secrets(s) => write!(f, "Secrets({} secrets)", s.len()),
            Answer::Unavailable => f.write_str("Unavailable"),
        }
    }
}

/// A request that waited for a lookup, to run again with
/// [`Server::replay`](crate::Server::replay).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// Where it came from.
    pub client: ClientAddr,
    /// The request, as received.
    pub data: Vec<u8>,
}

/// What a request gets from [`Store::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// It waits; it is replayed when the answer comes.
    Queued,
    /// The same request (client and transaction id) already waits: a retransmission.
    Duplicate,
    /// Too many lookups or waiting requests: answer 500 now.
    Busy,
}

/// A kept answer.
struct Entry {
    answer: Answer,
    fetched: Instant,
    /// Its position in `Store::order` (older positions are stale).
    seq: u64,
}

/// A request waiting for a lookup.
struct Waiting {
    client: ClientAddr,
    txid: [u8; 12],
    data: Vec<u8>,
}

/// A lookup in flight.
struct InFlight {
    id: u64,
    since: Instant,
    waiting: Vec<Waiting>,
}

/// The answers kept, the lookups in flight and the requests waiting for them.
pub(crate) struct Store {
    limits: CacheLimits,
    entries: HashMap<Query, Entry>,
    /// Queries by when they were fetched, oldest first (with stale positions).
    order: VecDeque<(Query, u64)>,
    next_seq: u64,
    in_flight: HashMap<Query, InFlight>,
    next_id: u64,
    waiting: usize,
    waiting_bytes: usize,
    lookups: VecDeque<Lookup>,
    replays: VecDeque<Replay>,
}

impl Store {
    pub(crate) fn new(limits: CacheLimits) -> Store {
        Store {
            limits,
            entries: HashMap::new(),
            order: VecDeque::new(),
            next_seq: 0,
            in_flight: HashMap::new(),
            next_id: 1,
            waiting: 0,
            waiting_bytes: 0,
            lookups: VecDeque::new(),
            replays: VecDeque::new(),
        }
    }

    /// The answer kept for `query`, and its age, unless it is older than the TTL.
    pub(crate) fn get(&self, query: &Query, now: Instant) -> Option<(&Answer, Duration)> {
        let e = self.entries.get(query)?;
        let age = now.saturating_duration_since(e.fetched);
        (age < self.limits.ttl).then_some((&e.answer, age))
    }

    /// Whether an answer of this age that did not authenticate a request is asked again.
    pub(crate) fn recheck(&self, age: Duration) -> bool {
        age >= self.limits.recheck
    }

    /// Makes the request `data` (from `client`, transaction `txid`) wait for `query`,
    /// starting a lookup in `realm` unless one is in flight.
    pub(crate) fn wait(
        &mut self,
        query: Query,
        realm: &str,
        (client, txid, data): (ClientAddr, [u8; 12], &[u8]),
        now: Instant,
    ) -> Wait {
        if let Some(f) = self.in_flight.get(&query) {
            if f.waiting
                .iter()
                .any(|w| w.client == client && w.txid == txid)
            {
                return Wait::Duplicate;
            }
        }
        if self.waiting >= self.limits.waiting
            || self.waiting_bytes + data.len() > self.limits.waiting_bytes
        {
            return Wait::Busy;
        }
        if !self.in_flight.contains_key(&query) {
            if self.in_flight.len() >= self.limits.lookups {
                return Wait::Busy;
            }
            let id = self.next_id;
            self.next_id += 1;
            self.lookups.push_back(Lookup {
                id,
                realm: realm.to_string(),
                query: query.clone(),
            });
            self.in_flight.insert(
                query.clone(),
                InFlight {
                    id,
                    since: now,
                    waiting: Vec::new(),
                },
            );
        }
        let Some(f) = self.in_flight.get_mut(&query) else {
            return Wait::Busy;
        };
        f.waiting.push(Waiting {
            client,
            txid,
            data: data.to_vec(),
        });
        self.waiting += 1;
        self.waiting_bytes += data.len();
        Wait::Queued
    }

    /// The I/O layer's answer to lookup `id`: kept, and its waiting requests queued for
    /// replay. `false` if no lookup with that id is in flight (answered already, timed out).
    pub(crate) fn answer(&mut self, id: u64, answer: Answer, now: Instant) -> bool {
        let Some(query) = self
            .in_flight
            .iter()
            .find(|(_, f)| f.id == id)
            .map(|(q, _)| q.clone())
        else {
            return false;
        };
        self.finish(query, answer, now);
        true
    }

    /// Ends the lookup for `query` with `answer`.
    fn finish(&mut self, query: Query, answer: Answer, now: Instant) {
        if let Some(f) = self.in_flight.remove(&query) {
            for w in f.waiting {
                self.waiting = self.waiting.saturating_sub(1);
                self.waiting_bytes = self.waiting_bytes.saturating_sub(w.data.len());
                self.replays.push_back(Replay {
                    client: w.client,
                    data: w.data,
                });
            }
        }
        self.keep(query, answer, now);
    }

    /// Keeps `answer` for `query`, fetched `now`, making room if the cache is full.
    fn keep(&mut self, query: Query, answer: Answer, now: Instant) {
        self.purge(now);
        while !self.entries.contains_key(&query) && self.entries.len() >= self.limits.entries {
            let Some((old, seq)) = self.order.pop_front() else {
                break;
            };
            if self.entries.get(&old).is_some_and(|e| e.seq == seq) {
                self.entries.remove(&old);
            }
        }
        if self.limits.entries == 0 {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.push_back((query.clone(), seq));
        self.entries.insert(
            query,
            Entry {
                answer,
                fetched: now,
                seq,
            },
        );
        if self.order.len() > 2 * self.limits.entries.max(16) {
            let entries = &self.entries;
            self.order
                .retain(|(q, s)| entries.get(q).is_some_and(|e| e.seq == *s));
        }
    }

    /// Drops the answers past their TTL (the oldest are at the front).
    fn purge(&mut self, now: Instant) {
        while let Some((q, seq)) = self.order.front() {
            match self.entries.get(q) {
                Some(e) if e.seq == *seq => {
                    if now.saturating_duration_since(e.fetched) < self.limits.ttl {
                        break;
                    }
                    self.entries.remove(q);
                }
                _ => {}
            }
            self.order.pop_front();
        }
    }

    /// Lookups not answered within the timeout count as [`Answer::Unavailable`]; returns
    /// how many.
    pub(crate) fn expire(&mut self, now: Instant) -> usize {
        let late: Vec<Query> = self
            .in_flight
            .iter()
            .filter(|(_, f)| now.saturating_duration_since(f.since) >= self.limits.lookup_timeout)
            .map(|(q, _)| q.clone())
            .collect();
        let n = late.len();
        for q in late {
            self.finish(q, Answer::Unavailable, now);
        }
        n
    }

    /// When the oldest lookup in flight times out.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.in_flight
            .values()
            .map(|f| f.since + self.limits.lookup_timeout)
            .min()
    }

    pub(crate) fn poll_lookup(&mut self) -> Option<Lookup> {
        self.lookups.pop_front()
    }

    pub(crate) fn poll_replay(&mut self) -> Option<Replay> {
        self.replays.pop_front()
    }

    /// A TCP/TLS connection closed: its waiting requests are dropped.
    pub(crate) fn forget_client(&mut self, client: &ClientAddr) {
        for f in self.in_flight.values_mut() {
            let before = f.waiting.len();
            let mut bytes = 0;
            f.waiting.retain(|w| {
                let gone = w.client == *client;
                if gone {
                    bytes += w.data.len();
                }
                !gone
            });
            self.waiting = self.waiting.saturating_sub(before - f.waiting.len());
            self.waiting_bytes = self.waiting_bytes.saturating_sub(bytes);
        }
        self.replays.retain(|r| r.client != *client);
    }

    /// Forgets every waiting request (the shutdown deadline); answers stay.
    pub(crate) fn clear_waiting(&mut self) {
        for f in self.in_flight.values_mut() {
            f.waiting.clear();
        }
        self.waiting = 0;
        self.waiting_bytes = 0;
        self.replays.clear();
    }

    /// Answers kept.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Requests waiting for lookups.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Transport;

    fn client(port: u16) -> ClientAddr {
        ClientAddr {
            transport: Transport::Udp,
            client: std::net::SocketAddr::from(([192, 0, 2, 1], port)),
            local: std::net::SocketAddr::from(([192, 0, 2, 9], 3478)),
        }
    }

    fn limits() -> CacheLimits {
        CacheLimits {
            entries: 3,
            lookups: 2,
            waiting: 4,
            waiting_bytes: 100,
            ..CacheLimits::default()
        }
    }

    fn user(n: &str) -> Query {
        Query::UserKey(n.into())
    }

    #[test]
    fn one_lookup_per_query_and_every_waiting_request_replayed_once() {
        let now = Instant::now();
        let mut s = Store::new(limits());
        assert_eq!(
            s.wait(user("a"), "r", (client(1), [1; 12], b"one"), now),
            Wait::Queued
        );
        assert_eq!(
            s.wait(user("a"), "r", (client(2), [2; 12], b"two"), now),
            Wait::Queued
        );
        // A retransmission waits once.
        assert_eq!(
            s.wait(user("a"), "r", (client(1), [1; 12], b"one"), now),
            Wait::Duplicate
        );
        let l = s.poll_lookup().expect("one lookup");
        assert_eq!((l.realm.as_str(), &l.query), ("r", &user("a")));
        assert_eq!(s.poll_lookup(), None);
        assert_eq!(s.waiting(), 2);
        assert!(s.answer(l.id, Answer::Key([5; 16]), now));
        assert!(!s.answer(l.id, Answer::NoUser, now), "answered twice");
        let replays: Vec<Vec<u8>> = std::iter::from_fn(|| s.poll_replay())
            .map(|r| r.data)
            .collect();
        assert_eq!(replays, vec![b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(s.waiting(), 0);
        assert_eq!(
            s.get(&user("a"), now).map(|(a, _)| a),
            Some(&Answer::Key([5; 16]))
        );
    }

    /// The bounds, as a table: what the next request gets.
    #[test]
    fn lookups_waiting_requests_and_bytes_are_bounded() {
        let now = Instant::now();
        let mut s = Store::new(limits());
        let cases: [(&str, u16, &[u8], Wait); 6] = [
            ("a", 1, b"x", Wait::Queued),
            ("b", 2, b"x", Wait::Queued),
            // A third query: two lookups are in flight already.
            ("c", 3, b"x", Wait::Busy),
            // Joining a lookup in flight still works.
            ("a", 4, b"x", Wait::Queued),
            // 100 bytes at most wait together.
            ("a", 5, &[0; 98], Wait::Busy),
            ("b", 6, b"x", Wait::Queued),
        ];
        for (q, port, data, want) in cases {
            assert_eq!(
                s.wait(user(q), "r", (client(port), [port as u8; 12], data), now),
                want,
                "{q} from {port}"
            );
        }
        // Four wait: the fifth is one too many.
        assert_eq!(
            s.wait(user("a"), "r", (client(7), [7; 12], b"x"), now),
            Wait::Busy
        );
    }

    #[test]
    fn a_lookup_that_takes_too_long_answers_unavailable() {
        let now = Instant::now();
        let mut s = Store::new(limits());
        s.wait(user("a"), "r", (client(1), [1; 12], b"x"), now);
        let l = s.poll_lookup().expect("lookup");
        assert_eq!(s.deadline(), Some(now + Duration::from_secs(3)));
        s.expire(now + Duration::from_millis(2999));
        assert!(s.poll_replay().is_none());
        s.expire(now + Duration::from_secs(3));
        assert!(s.poll_replay().is_some());
        assert_eq!(
            s.get(&user("a"), now + Duration::from_secs(3))
                .map(|(a, _)| a),
            Some(&Answer::Unavailable)
        );
        assert_eq!(s.deadline(), None);
        // The late answer finds nothing to answer.
        assert!(!s.answer(l.id, Answer::Key([1; 16]), now + Duration::from_secs(4)));
    }

    #[test]
    fn answers_expire_and_the_oldest_goes_when_full() {
        let t0 = Instant::now();
        let mut s = Store::new(limits());
        for (i, q) in ["a", "b", "c", "d"].iter().enumerate() {
            s.keep(
                user(q),
                Answer::NoUser,
                t0 + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(s.len(), 3);
        assert!(s.get(&user("a"), t0).is_none(), "the oldest went");
        let (_, age) = s.get(&user("d"), t0 + Duration::from_secs(2)).expect("d");
        assert!(s.recheck(age));
        assert!(!s.recheck(Duration::from_millis(999)));
        // Refreshing an entry moves it to the back.
        s.keep(user("b"), Answer::Key([1; 16]), t0 + Duration::from_secs(1));
        s.keep(user("e"), Answer::NoUser, t0 + Duration::from_secs(1));
        assert!(s.get(&user("c"), t0 + Duration::from_secs(1)).is_none());
        assert!(s.get(&user("b"), t0 + Duration::from_secs(1)).is_some());
        // Past the TTL nothing is used, and a later insert purges it.
        let late = t0 + Duration::from_secs(11) + Duration::from_millis(10);
        assert!(s.get(&user("b"), late).is_none());
        s.keep(user("f"), Answer::NoUser, late);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn a_closed_connection_takes_its_waiting_requests_along() {
        let now = Instant::now();
        let mut s = Store::new(limits());
        s.wait(user("a"), "r", (client(1), [1; 12], b"xx"), now);
        s.wait(user("a"), "r", (client(2), [2; 12], b"y"), now);
        s.forget_client(&client(1));
        assert_eq!(s.waiting(), 1);
        let l = s.poll_lookup().expect("lookup");
        s.answer(l.id, Answer::NoUser, now);
        let r: Vec<ClientAddr> = std::iter::from_fn(|| s.poll_replay())
            .map(|r| r.client)
            .collect();
        assert_eq!(r, vec![client(2)]);
    }
}
