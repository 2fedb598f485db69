//! The resource store over etcd v3.
//!
//! Every object is one key, `<prefix>/<kind>/<name>`, holding its JSON. Its revision is the
//! key's `mod_revision`, so update-if-revision is one transaction comparing it, and a watch can
//! resume from any revision etcd has not compacted yet.

use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, KeyValue,
    TlsOptions, Txn, TxnOp, TxnOpResponse,
};
use ipam_core::store::{RawObject, Revision, Store, StoreError, WATCH_BUFFER, Watch};

use crate::{
    config::{EtcdConfig, TlsFiles},
    error::EtcdError,
    watch::{WatchedStore, feed_watch},
};

/// Reads and writes that fail for a reason time can fix (a member restarting, a leader
/// election) are tried at least this many times, and again until the request timeout has
/// passed, before the error goes to the caller.
///
/// A refusal by one member of several does not count as an attempt: the client's balancer
/// keeps a dead member in its rotation (it reconnects on each pick and hands the refusal to
/// the request), so with one member of three down about one request in three lands there.
/// Such a refusal says nothing about the cluster; the next try most likely goes elsewhere.
/// Only when refusals go on past twice the request timeout are all members taken to be down.
const ATTEMPTS: u32 = 3;
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(50);
const LONGEST_RETRY_PAUSE: Duration = Duration::from_millis(400);
/// How long a member may take to answer the health check of a failed request's diagnosis.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    config: EtcdConfig,
}

impl EtcdStore {
    /// Connects to the members. Fails only on a configuration that can never work (bad URL,
    /// unreadable TLS files); members that are down are retried by every later request.
    pub async fn connect(config: EtcdConfig) -> Result<Self, EtcdError> {
        if config.endpoints.is_empty() {
            return Err(EtcdError::Config(
                "no endpoints; list the members' client URLs in [store.etcd] endpoints".into(),
            ));
        }
        let client = Client::connect(&config.endpoints, Some(connect_options(&config)?))
            .await
            .map_err(|e| {
                EtcdError::classify(&e, &config.endpoint_list(), config.request_timeout_ms)
            })?;
        Ok(Self { client, config })
    }

    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Asks every member on its own, all at once, whether it answers, so an error can say
    /// which of them failed and why. `Ok` is the member's view of the cluster's leader.
    pub async fn check_members(&self) -> Vec<(String, Result<u64, EtcdError>)> {
        let timeout = self.config.request_timeout().min(CHECK_TIMEOUT);
        let mut checks = tokio::task::JoinSet::new();
        for (index, endpoint) in self.config.endpoints.iter().enumerate() {
            let (endpoint, config) = (endpoint.clone(), self.config.clone());
            checks.spawn(async move {
                let checked = tokio::time::timeout(timeout, check_member(&endpoint, &config))
                    .await
                    .unwrap_or_else(|_| {
                        Err(EtcdError::Timeout {
                            endpoint: endpoint.clone(),
                            timeout_ms: timeout.as_millis() as u64,
                        })
                    });
                (index, endpoint, checked)
            });
        }
        let mut out: Vec<_> = checks.join_all().await;
        out.sort_by_key(|(index, ..)| *index);
        out.into_iter()
            .map(|(_, e, checked)| (e, checked))
            .collect()
    }

    /// After a request failed on every attempt: what each member says, when none could serve.
    async fn diagnose(&self, error: EtcdError) -> EtcdError {
        let members = self.check_members().await;
        let failed: Vec<(String, EtcdError)> = members
            .into_iter()
            .filter_map(|(endpoint, checked)| match checked {
                Ok(0) => Some((
                    endpoint.clone(),
                    EtcdError::NoLeader {
                        endpoint,
                        detail: "it sees no leader".into(),
                    },
                )),
                Ok(_) => None,
                Err(e) => Some((endpoint, e)),
            })
            .collect();
        if failed.len() == self.config.endpoints.len() {
            EtcdError::Unavailable { members: failed }
        } else {
            error
        }
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}/{kind}/{name}", self.config.prefix)
    }

    pub(crate) fn kind_prefix(&self, kind: &str) -> String {
        format!("{}/{kind}/", self.config.prefix)
    }

    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    pub(crate) fn backend_error(&self, e: &etcd_client::Error) -> StoreError {
        backend(EtcdError::classify(
            e,
            &self.config.endpoint_list(),
            self.config.request_timeout_ms,
        ))
    }

    /// Runs `op` until it succeeds, fails for good, or the attempts are spent.
    async fn retrying<T, F, Fut>(&self, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let several_members = self.config.endpoints.len() > 1;
        let mut attempts = 0;
        let mut pause = FIRST_RETRY_PAUSE;
        let started = tokio::time::Instant::now();
        let deadline = started + self.config.request_timeout();
        let last_chance = started + 2 * self.config.request_timeout();
        loop {
            let result =
                tokio::time::timeout(self.config.request_timeout(), op(self.client())).await;
            let error = match result {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) => EtcdError::classify(
                    &e,
                    &self.config.endpoint_list(),
                    self.config.request_timeout_ms,
                ),
                Err(_) => EtcdError::Timeout {
                    endpoint: self.config.endpoint_list(),
                    timeout_ms: self.config.request_timeout_ms,
                },
            };
            if !error.is_transient() {
                return Err(backend(error));
            }
            if !(several_members && matches!(error, EtcdError::Refused { .. })) {
                attempts += 1;
            }
            let resume_at = tokio::time::Instant::now() + pause;
            let spent = attempts >= ATTEMPTS && resume_at >= deadline;
            if spent || resume_at >= last_chance {
                return Err(backend(self.diagnose(error).await));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LONGEST_RETRY_PAUSE);
        }
    }

    /// The objects of `kind` and the store revision they were read at.
    pub(crate) async fn list_at(&self, kind: &str) -> Result<(Vec<RawObject>, u64), StoreError> {
        let prefix = self.kind_prefix(kind);
        let response = self
            .retrying(|mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let revision = response.header().map_or(0, |h| h.revision() as u64);
        let objects = response
            .kvs()
            .iter()
            .filter_map(|kv| self.object(kind, kv))
            .collect();
        Ok((objects, revision))
    }

    /// The object a key-value holds, if the key is one of `kind`'s.
    pub(crate) fn object(&self, kind: &str, kv: &KeyValue) -> Option<RawObject> {
        let name = self.name_of(kind, kv.key())?;
        Some(RawObject {
            kind: kind.to_owned(),
            name,
            revision: Revision::Number(kv.mod_revision() as u64),
            value: kv.value().to_vec(),
        })
    }

    pub(crate) fn name_of(&self, kind: &str, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        key.strip_prefix(&self.kind_prefix(kind)).map(str::to_owned)
    }

    /// A conditional write on `key`: `op` if `compare` holds, else read the key to say why not.
    /// Returns the new revision, or the key as it is when the condition failed.
    async fn write_if(
        &self,
        key: &str,
        compare: Compare,
        op: TxnOp,
    ) -> Result<Result<u64, Option<KeyValue>>, StoreError> {
        let txn = Txn::new()
            .when([compare])
            .and_then([op])
            .or_else([TxnOp::get(key, None)]);
        let response = self
            .retrying(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        if response.succeeded() {
            return Ok(Ok(response.header().map_or(0, |h| h.revision() as u64)));
        }
        let current = response.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
            _ => None,
        });
        Ok(Err(current))
    }
}

/// The etcd mod_revision a write is conditioned on. Every revision this store hands out is a
/// number; any other can match no key, so the write fails as a conflict.
fn mod_revision(expected: &Revision) -> i64 {
    expected
        .number()
        .and_then(|n| i64::try_from(n).ok())
        .unwrap_or(-1)
}

pub(crate) fn backend(e: EtcdError) -> StoreError {
    StoreError::Backend {
        location: "etcd".to_owned(),
        source: Box::new(e),
    }
}

fn classify_one(e: &etcd_client::Error, endpoint: &str, config: &EtcdConfig) -> EtcdError {
    EtcdError::classify(e, endpoint, config.request_timeout_ms)
}

async fn check_member(endpoint: &str, config: &EtcdConfig) -> Result<u64, EtcdError> {
    let mut one = Client::connect([endpoint], Some(connect_options(config)?))
        .await
        .map_err(|e| classify_one(&e, endpoint, config))?;
    let status = one
        .status()
        .await
        .map_err(|e| classify_one(&e, endpoint, config))?;
    Ok(status.leader())
}

/// How often a connection with a watch or a request open pings its etcd member: twice etcd's
/// default `--grpc-keepalive-min-time` (5 s), so a ping late or early by scheduling never
/// counts against it.
pub const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);

fn connect_options(config: &EtcdConfig) -> Result<ConnectOptions, EtcdError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.dial_timeout())
        .with_timeout(config.request_timeout())
        // Find a dead member behind an open connection without waiting for TCP's timeout,
        // but ping no faster than etcd allows: it closes a connection whose pings come more often
        // than its `--grpc-keepalive-min-time` (5 s by default) or, with no stream open, at
        // all (GOAWAY `too_many_pings` at the third). Pings every 2 s, and while idle, broke
        // every agent's watches every 6-10 s: each break left its copies stale for a second or
        // more, and a service IP whose node died then moved 750 ms late (the gossip test's
        // muted node, CI). A connection with no stream finds a dead member through its
        // requests' timeouts instead, and a quiet watch through its progress requests
        // (`watch::QUIET_FOR`). An answer to a ping may take the dial timeout, and no less than
        // a second: a loaded host answering late must not lose every watch with its connection.
        .with_keep_alive(
            KEEP_ALIVE_EVERY,
            config.dial_timeout().max(Duration::from_secs(1)),
        )
        .with_keep_alive_while_idle(false)
        // A member cut off from the leader fails requests at once instead of hanging.
        .with_require_leader(true);
    if let Some(tls) = &config.tls {
        options = options.with_tls(tls_options(tls)?);
    }
    Ok(options)
}

fn tls_options(files: &TlsFiles) -> Result<TlsOptions, EtcdError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|source| EtcdError::File {
            path: path.to_owned(),
            source,
        })
    };
    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&files.ca)?));
    match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        (None, None) => {}
        _ => {
            return Err(EtcdError::Config(
                "[store.etcd.tls] needs both cert and key for a client certificate, or neither"
                    .into(),
            ));
        }
    }
    if let Some(name) = &files.server_name {
        tls = tls.domain_name(name.clone());
    }
    Ok(tls)
}

impl Store for EtcdStore {
    async fn get(&self, kind: &str, name: &str) -> Result<Option<RawObject>, StoreError> {
        let key = self.key(kind, name);
        let response = self
            .retrying(|mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        Ok(response.kvs().first().and_then(|kv| self.object(kind, kv)))
    }

    async fn list(&self, kind: &str) -> Result<Vec<RawObject>, StoreError> {
        Ok(self.list_at(kind).await?.0)
    }

    async fn create(&self, kind: &str, name: &str, value: Vec<u8>) -> Result<Revision, StoreError> {
        ipam_core::store::check_name(kind, name)?;
        let key = self.key(kind, name);
        // A key that does not exist has create_revision 0.
        let compare = Compare::create_revision(key.as_str(), CompareOp::Equal, 0);
        match self
            .write_if(&key, compare, TxnOp::put(key.as_str(), value, None))
            .await?
        {
            Ok(revision) => Ok(revision.into()),
            Err(_) => Err(StoreError::AlreadyExists {
                kind: kind.to_owned(),
                name: name.to_owned(),
            }),
        }
    }

    async fn update(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        let key = self.key(kind, name);
        let compare = Compare::mod_revision(key.as_str(), CompareOp::Equal, mod_revision(expected));
        match self
            .write_if(&key, compare, TxnOp::put(key.as_str(), value, None))
            .await?
        {
            Ok(revision) => Ok(revision.into()),
            Err(None) => Err(StoreError::NotFound {
                kind: kind.to_owned(),
                name: name.to_owned(),
            }),
            Err(Some(current)) => Err(StoreError::Conflict {
                kind: kind.to_owned(),
                name: name.to_owned(),
                expected: expected.clone(),
                actual: Revision::Number(current.mod_revision() as u64),
            }),
        }
    }

    /// The object is kept whole here: its status is written with the rest.
    async fn update_status(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        self.update(kind, name, value, expected).await
    }

    async fn delete(
        &self,
        kind: &str,
        name: &str,
        expected: Option<&Revision>,
    ) -> Result<(), StoreError> {
        let key = self.key(kind, name);
        let Some(expected) = expected else {
            self.retrying(|mut c| {
                let key = key.clone();
                async move { c.delete(key, None).await }
            })
            .await?;
            return Ok(());
        };
        let compare = Compare::mod_revision(key.as_str(), CompareOp::Equal, mod_revision(expected));
        match self
            .write_if(&key, compare, TxnOp::delete(key.as_str(), None))
            .await?
        {
            // Deleting nothing is not an error.
            Ok(_) | Err(None) => Ok(()),
            Err(Some(current)) => Err(StoreError::Conflict {
                kind: kind.to_owned(),
                name: name.to_owned(),
                expected: expected.clone(),
                actual: Revision::Number(current.mod_revision() as u64),
            }),
        }
    }

    async fn watch(&self, kind: &str) -> Result<Watch, StoreError> {
        let (initial, revision) = self.list_at(kind).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
        tokio::spawn(feed_watch(self.clone(), kind.to_owned(), revision, tx));
        Ok(Watch::new(initial, revision.into(), rx))
    }
}

impl WatchedStore for EtcdStore {
    fn client(&self) -> Client {
        EtcdStore::client(self)
    }

    fn kind_prefix(&self, kind: &str) -> String {
        EtcdStore::kind_prefix(self, kind)
    }

    fn backend_error(&self, e: &etcd_client::Error) -> StoreError {
        EtcdStore::backend_error(self, e)
    }

    fn answer_within(&self) -> Duration {
        self.config.request_timeout()
    }

    fn object(&self, kind: &str, kv: &KeyValue) -> Option<RawObject> {
        EtcdStore::object(self, kind, kv)
    }

    fn name_of(&self, kind: &str, key: &[u8]) -> Option<String> {
        EtcdStore::name_of(self, kind, key)
    }

    async fn list_at(&self, kind: &str) -> Result<(Vec<RawObject>, u64), StoreError> {
        EtcdStore::list_at(self, kind).await
    }
}
