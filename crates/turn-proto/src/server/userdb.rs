//! Keys from a user database: where a request's key comes from (its allocation's, the
//! configuration's, the database's), and the lookups and replays the I/O layer drives (see
//! [`crate::credentials`]).

use std::time::Instant;

use super::{Reply, Server};
use crate::auth::{keys_for, rest_expiry, scheme_password, Keys};
use crate::config::{DatabaseKeys, RestScheme};
use crate::credentials::{Answer, Lookup, Query, Replay, Wait};
use crate::stun::{long_term_key, Message};
use crate::types::{AuthFailure, ClientAddr, Output};

/// Where a request's key came from, or why there is none.
pub(super) enum Resolved {
    /// This key verifies the request; the REST credential's expiry (UNIX seconds).
    Key([u8; 16], Option<u64>),
    /// Nobody by that name (401).
    Unknown,
    /// A key or secrets that do not verify the request (401).
    Bad,
    /// A `zrest` credential past its expiry (401).
    Expired,
    /// The user database could not say, or too much waits for it (500).
    Unavailable(AuthFailure),
    /// The request waits for a lookup (no answer now).
    Waiting,
}

impl Server {
    /// The next lookup for the I/O layer: run it (with a timeout shorter than
    /// [`CacheLimits::lookup_timeout`](crate::CacheLimits::lookup_timeout)) and answer with
    /// [`lookup_done`](Self::lookup_done). Call until `None` after every call into the server.
    pub fn poll_lookup(&mut self) -> Option<Lookup> {
        let l = self.store.poll_lookup()?;
        self.counters.userdb_lookups += 1;
        Some(l)
    }

    /// The answer to lookup `id`. The requests that waited for it come out of
    /// [`poll_replay`](Self::poll_replay); an answer that comes too late changes nothing.
    pub fn lookup_done(&mut self, now: Instant, id: u64, answer: Answer) {
        let unavailable = answer == Answer::Unavailable;
        if self.store.answer(id, answer, now) && unavailable {
            self.counters.userdb_unavailable += 1;
        }
    }

    /// The next request that waited for a lookup: run it through [`replay`](Self::replay)
    /// and send what that returns, as after [`handle_client`](Self::handle_client). Call until
    /// `None` after every call into the server.
    pub fn poll_replay(&mut self) -> Option<Replay> {
        self.store.poll_replay()
    }

    /// Runs a request that waited for a lookup ([`Replay`]) as [`handle_client`] would (its
    /// datagram is not counted again); it finds the answer now and never waits twice: an
    /// answer gone meanwhile gets 500.
    ///
    /// [`handle_client`]: Self::handle_client
    pub fn replay<'a>(
        &mut self,
        now: Instant,
        from: ClientAddr,
        data: &'a [u8],
        out: &'a mut Vec<u8>,
    ) -> Option<Output<'a>> {
        self.replaying = true;
        let output = self.client_message(now, from, data, out);
        self.replaying = false;
        output
    }

    /// Answers kept of the user database, and requests waiting for it.
    pub fn userdb_cache(&self) -> (usize, usize) {
        (self.store.len(), self.store.waiting())
    }

    /// The key and REST expiry of `from`'s allocation, if it belongs to `username`.
    pub(super) fn allocation_key(
        &self,
        from: &ClientAddr,
        username: &str,
    ) -> Option<([u8; 16], Option<Instant>)> {
        let idx = *self.by_client.get(from)?;
        let a = self.allocs.get(idx)?.as_ref()?;
        (a.username == username).then_some(a.key).flatten()
    }

    /// The key for `username` that verifies `msg` (`check`): a static user's, a
    /// `static-auth-secret`'s, or the user database's (which may make the request wait).
    pub(super) fn resolve_key(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        msg: &Message<'_>,
        username: &str,
        check: &dyn Fn(&[u8; 16]) -> bool,
    ) -> Resolved {
        let database = self.config.auth.database.map(|d| d.keys);
        let rest_db = database == Some(DatabaseKeys::RestSecrets);
        let zrest = self.config.auth.rest_scheme == RestScheme::Zrest;
        let unix = self.unix(now);
        let query = match keys_for(&self.config.auth, &self.config.realm, username, unix) {
            Keys::Static(k) if check(&k) => return Resolved::Key(k, None),
            Keys::Static(_) => return Resolved::Bad,
            Keys::Rest { keys, expiry } => match keys.into_iter().find(|k| check(k)) {
                Some(k) => return Resolved::Key(k, expiry),
                None if rest_db => Query::RestSecrets,
                None => return Resolved::Bad,
            },
            Keys::Expired => return Resolved::Expired,
            // zrest falls back to nothing, a user database's users included.
            Keys::Unknown if zrest => return Resolved::Unknown,
            Keys::Unknown => match database {
                Some(DatabaseKeys::Users) => Query::UserKey(username.to_string()),
                Some(DatabaseKeys::RestSecrets)
                    if rest_expiry(username, self.config.auth.rest_separator).is_some() =>
                {
                    Query::RestSecrets
                }
                _ => return Resolved::Unknown,
            },
        };
        self.database_key(now, from, msg, username, query, check)
    }

    /// The user database's key for `query`: kept, or asked for (the request then waits).
    fn database_key(
        &mut self,
        now: Instant,
        from: &ClientAddr,
        msg: &Message<'_>,
        username: &str,
        query: Query,
        check: &dyn Fn(&[u8; 16]) -> bool,
    ) -> Resolved {
        let expiry = match (&query, self.config.auth.rest_scheme) {
            (Query::RestSecrets, RestScheme::Timestamp) => {
                rest_expiry(username, self.config.auth.rest_separator)
            }
            // A zrest allocation's lifetime is not capped (its expiry was checked already).
            (Query::RestSecrets, RestScheme::Zrest) | (Query::UserKey(_), _) => None,
        };
        if let Some((answer, age)) = self.store.get(&query, now) {
            let verdict = self.verdict(answer, username, expiry, check);
            if matches!(verdict, Resolved::Key(..)) || self.replaying || !self.store.recheck(age) {
                if !self.replaying {
                    self.counters.userdb_cached += 1;
                }
                return verdict;
            }
        } else if self.replaying {
            // Its answer came and went (the cache is full): no second wait.
            return Resolved::Unavailable(AuthFailure::DatabaseUnavailable);
        }
        let realm = self.config.realm.clone();
        let request = (*from, msg.transaction_id(), msg.bytes());
        match self.store.wait(query, &realm, request, now) {
            Wait::Queued | Wait::Duplicate => Resolved::Waiting,
            Wait::Busy => Resolved::Unavailable(AuthFailure::DatabaseBusy),
        }
    }

    /// What a kept answer says of this request.
    fn verdict(
        &self,
        answer: &Answer,
        username: &str,
        expiry: Option<u64>,
        check: &dyn Fn(&[u8; 16]) -> bool,
    ) -> Resolved {
        match answer {
            Answer::Key(k) if check(k) => Resolved::Key(*k, None),
            Answer::Key(_) => Resolved::Bad,
            Answer::NoUser => Resolved::Unknown,
            Answer::Secrets(secrets) => {
                let realm = &self.config.realm;
                let scheme = self.config.auth.rest_scheme;
                secrets
                    .iter()
                    .map(|s| long_term_key(username, realm, &scheme_password(scheme, s, username)))
                    .find(|k| check(k))
                    .map_or(Resolved::Bad, |k| Resolved::Key(k, expiry))
            }
            Answer::Unavailable => Resolved::Unavailable(AuthFailure::DatabaseUnavailable),
        }
    }

    /// Lookups past their timeout count as unavailable (from `handle_timeout`).
    pub(super) fn expire_lookups(&mut self, now: Instant) {
        let late = self.store.expire(now);
        self.counters.userdb_unavailable += late as u64;
    }

    /// When the oldest lookup in flight times out.
    pub(super) fn lookup_deadline(&self) -> Option<Instant> {
        self.store.deadline()
    }

    /// The answer to a request whose key is unavailable: 500 (try again).
    pub(super) fn unavailable(
        &mut self,
        from: &ClientAddr,
        username: &str,
        reason: AuthFailure,
        ctx: &super::Ctx,
        out: &mut Vec<u8>,
    ) -> Reply {
        self.auth_failed(from, Some(username.to_string()), reason);
        self.error(ctx, 500, out)
    }
}
