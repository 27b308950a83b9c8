//! Key layout, ownership and the predecessor watch.
//!
//! # Layout (etcd's `clientv3/concurrency` Mutex)
//! Lock `NAME` is the key prefix `{prefix}NAME/`. A client's claim is the
//! key `{prefix}NAME/{lease id as lowercase hex}`, created only if absent
//! and attached to the client's session lease; its value is the owner
//! token, and the holder's description when one was given (see
//! [`lock_core::owner_value`]; Go's Mutex writes an empty value and nobody
//! reads it but polylock, which compares the owner on release). The claim
//! with the lowest create revision holds the lock; the others queue in create-revision order,
//! which is arrival order, so the queue is FIFO.
//!
//! # Names with '/'
//! Names map to keys verbatim, so the prefix of `a` (`a/`) is also the
//! start of the keys of `a/b` (`a/b/{lease}`). A claim is therefore only a
//! key directly under the prefix whose rest is a lease id (1 to 16
//! lowercase hex digits): polylock's `a` and `a/b` never see each other's
//! claims. (Go's Mutex does not filter: a Go client locking `a` also waits
//! for holders of `a/b`. That only makes it wait longer, never lets two in.)
//!
//! # Fencing
//! The holder's create revision is its fencing token: etcd revisions are
//! global, never reused, survive restarts and leader changes, and a later
//! holder's claim was necessarily created after the earlier holder's.

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, GetResponse, KeyValue, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use lock_core::{LockError, LockName, OwnerToken};

use crate::conn::{Conn, Retry};
use crate::errors::unexpected;
use crate::watch::{Note, Subscription};
use lock_core::parse_owner_value;

/// How many claims one ranged read fetches before falling back to a full
/// read (only needed when keys of longer names sort between the claims).
const PAGE: i64 = 16;

/// The key prefix of lock `name`: `{prefix}{name}/`.
pub(crate) fn lock_prefix(prefix: &str, name: &LockName) -> String {
    format!("{prefix}{name}/")
}

/// A claim key: `{prefix}{name}/{lease id in lowercase hex}`, exactly as
/// Go's `fmt.Sprintf("%s/%x", pfx, leaseID)`.
pub(crate) fn claim_key(lock_prefix: &str, lease_id: i64) -> String {
    format!("{lock_prefix}{lease_id:x}")
}

/// The lease id a claim key ends with.
pub(crate) fn lease_of_key(key: &str) -> Option<i64> {
    let hex = key.rsplit('/').next()?;
    if !is_lease_hex(hex.as_bytes()) {
        return None;
    }
    i64::from_str_radix(hex, 16).ok()
}

fn is_lease_hex(s: &[u8]) -> bool {
    (1..=16).contains(&s.len()) && s.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `key` is a claim directly under `lock_prefix`.
pub(crate) fn is_claim(lock_prefix: &str, key: &[u8]) -> bool {
    key.strip_prefix(lock_prefix.as_bytes())
        .is_some_and(is_lease_hex)
}

/// The range `[prefix "0", prefix "g")` holds every claim (lease ids are
/// hex) and skips most keys of longer names.
pub(crate) fn claim_range(lock_prefix: &str) -> (String, String) {
    (format!("{lock_prefix}0"), format!("{lock_prefix}g"))
}

/// One claim as read from etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) key: String,
    pub(crate) create_rev: i64,
    pub(crate) lease: i64,
    /// The value, when the read asked for values (empty otherwise).
    pub(crate) value: Vec<u8>,
}

impl Claim {
    fn from_kv(kv: &KeyValue) -> Option<Claim> {
        Some(Claim {
            key: kv.key_str().ok()?.to_string(),
            create_rev: kv.create_revision(),
            lease: kv.lease(),
            value: kv.value().to_vec(),
        })
    }
}

/// Whether a read fetches the values of the claims too (only `inspect`
/// and `list` need them: the holder's owner and description).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Values {
    Skip,
    Fetch,
}

fn claims_options(
    lock_prefix: &str,
    order: SortOrder,
    limit: i64,
    values: Values,
) -> (String, GetOptions) {
    let (start, end) = claim_range(lock_prefix);
    let mut opts = GetOptions::new()
        .with_range(end)
        .with_sort(SortTarget::Create, order)
        .with_limit(limit);
    if values == Values::Skip {
        opts = opts.with_keys_only();
    }
    (start, opts)
}

/// The first claim in a sorted read, if the page shows it. `None` inside
/// means the page had none and nothing more; an outer `None` that more
/// keys need reading.
fn first_in(lock_prefix: &str, r: &GetResponse) -> Option<Option<Claim>> {
    match r.kvs().iter().find(|kv| is_claim(lock_prefix, kv.key())) {
        Some(kv) => Some(Claim::from_kv(kv)),
        None if r.more() => None,
        None => Some(None),
    }
}

/// The holder: the claim with the lowest create revision.
///
/// # Cancel safety
/// Cancel safe: read only.
pub(crate) async fn holder(
    conn: &Conn,
    lock_prefix: &str,
    values: Values,
) -> Result<Option<Claim>, LockError> {
    let (start, opts) = claims_options(lock_prefix, SortOrder::Ascend, PAGE, values);
    let r = conn
        .get("reading the lock holder", start, Some(opts))
        .await?;
    if let Some(found) = first_in(lock_prefix, &r) {
        return Ok(found);
    }
    let (start, opts) = claims_options(lock_prefix, SortOrder::Ascend, 0, values);
    let r = conn
        .get("reading the lock holder", start, Some(opts))
        .await?;
    Ok(first_in(lock_prefix, &r).flatten())
}

/// What one read of the queue saw from our claim's place in it.
#[derive(Clone, Debug)]
pub(crate) struct Ahead {
    /// The claim just before ours (the highest create revision below it).
    pub(crate) pred: Option<Claim>,
    /// The claim just before `pred`, if the read showed one: its delete
    /// makes `pred` the holder and ours the next in line.
    pub(crate) pred2: Option<Claim>,
    /// `pred` is the only claim ahead of ours: once it is deleted, ours is
    /// the lowest for good (claims created later sort after ours).
    pub(crate) only: bool,
    /// Our own claim, if it exists (on its lease, so the lease is alive).
    pub(crate) mine: Option<Claim>,
    /// The revision the read saw: a watch from the next one misses no
    /// delete.
    pub(crate) rev: i64,
}

impl Ahead {
    /// Whether our claim (`key`, created at `my_rev` on lease `lease`) is
    /// the lowest: nothing ahead, and it exists, on our lease.
    pub(crate) fn first(&self, key: &str, my_rev: i64, lease: i64) -> bool {
        self.pred.is_none() && self.is_mine(key, my_rev, lease)
    }

    /// Whether our claim still exists as we created it.
    pub(crate) fn is_mine(&self, key: &str, my_rev: i64, lease: i64) -> bool {
        self.mine
            .as_ref()
            .is_some_and(|c| c.key == key && c.create_rev == my_rev && c.lease == lease)
    }
}

/// The claims ahead of ours (created at `my_rev`) and our own claim, read
/// in one transaction, so at one revision: with nothing ahead and our claim
/// there, ours is the lowest, i.e. holds, and its lease was alive at that
/// revision. One round trip where a predecessor read and a holder read
/// took two.
///
/// # Cancel safety
/// Cancel safe: read only.
pub(crate) async fn look_ahead(
    conn: &Conn,
    lock_prefix: &str,
    key: &str,
    my_rev: i64,
) -> Result<Ahead, LockError> {
    let what = "reading the claim ahead in the queue";
    let mut limit = PAGE;
    loop {
        let (start, opts) = claims_options(lock_prefix, SortOrder::Descend, limit, Values::Skip);
        let txn = Txn::new().and_then(vec![
            TxnOp::get(start, Some(opts.with_max_create_revision(my_rev - 1))),
            TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
        ]);
        let r = conn.txn(what, Retry::Any, txn).await?;
        let rev = header_revision(what, r.header())?;
        let ops = r.op_responses();
        let (Some(TxnOpResponse::Get(page)), Some(TxnOpResponse::Get(own))) =
            (ops.first(), ops.get(1))
        else {
            return Err(unexpected(what, "the transaction answered without a read"));
        };
        let Some(pred) = first_in(lock_prefix, page) else {
            limit = 0;
            continue;
        };
        // The page is complete (`more` false) and shows one claim: nothing
        // else is ahead.
        let mut claims = page
            .kvs()
            .iter()
            .filter(|kv| is_claim(lock_prefix, kv.key()));
        let pred2 = claims.nth(1).and_then(Claim::from_kv);
        let only = pred.is_some() && pred2.is_none() && !page.more();
        let mine = own.kvs().first().and_then(Claim::from_kv);
        return Ok(Ahead {
            pred,
            pred2,
            only,
            mine,
            rev,
        });
    }
}

/// Our own claim as it is now, if it exists.
///
/// # Cancel safety
/// Cancel safe: read only.
pub(crate) async fn claim_of(conn: &Conn, key: &str) -> Result<Option<Claim>, LockError> {
    let r = conn
        .get(
            "checking the lock key",
            key,
            Some(GetOptions::new().with_keys_only()),
        )
        .await?;
    Ok(r.kvs().first().and_then(Claim::from_kv))
}

/// How many keys one transaction of [`claims_of_many`] reads: etcd refuses
/// transactions of more than 128 operations by default (`--max-txn-ops`).
pub(crate) const KEYS_PER_TXN: usize = 128;

/// Our claims `keys` as they are now (`None` for a key that does not
/// exist), in order: one read-only transaction per [`KEYS_PER_TXN`] keys,
/// all sent at once. A failed transaction fails only its own keys.
///
/// # Cancel safety
/// Cancel safe: read only.
pub(crate) async fn claims_of_many(
    conn: &Conn,
    keys: &[&str],
) -> Vec<Result<Option<Claim>, LockError>> {
    let what = "checking the lock keys";
    let chunks = keys.chunks(KEYS_PER_TXN).map(|chunk| async move {
        let gets = chunk
            .iter()
            .map(|k| TxnOp::get(*k, Some(GetOptions::new().with_keys_only())))
            .collect::<Vec<_>>();
        let r = match conn.txn(what, Retry::Any, Txn::new().and_then(gets)).await {
            Ok(r) => r,
            Err(e) => return each_failed(e, chunk.len()),
        };
        let ops = r.op_responses();
        if ops.len() != chunk.len() {
            return each_failed(
                unexpected(what, "the transaction answered another number of reads"),
                chunk.len(),
            );
        }
        ops.iter()
            .map(|op| match op {
                TxnOpResponse::Get(g) => Ok(g.kvs().first().and_then(Claim::from_kv)),
                _ => Err(unexpected(what, "the transaction answered without a read")),
            })
            .collect()
    });
    futures::future::join_all(chunks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// One failure for each of `n` keys read together: the first gets the
/// error itself, the others the same message and retryability.
fn each_failed(e: LockError, n: usize) -> Vec<Result<Option<Claim>, LockError>> {
    let copy = |e: &LockError| {
        if e.is_retryable() {
            LockError::transient(crate::errors::BACKEND, e.to_string())
        } else {
            LockError::permanent(crate::errors::BACKEND, e.to_string())
        }
    };
    let mut out: Vec<_> = (1..n).map(|_| Err(copy(&e))).collect();
    out.insert(0, Err(e));
    out
}

/// What creating a claim found.
#[derive(Debug)]
pub(crate) struct Created {
    /// The claim's create revision: its place in the queue and its fence.
    pub(crate) rev: i64,
    /// Whether it is the only claim, i.e. holds the lock. `false` says
    /// nothing: keys of longer names may share the range, so
    /// [`look_ahead`] tells.
    pub(crate) alone: bool,
}

/// Creates the claim `key` (`value`, see [`lock_core::owner_value`],
/// attached to `lease`) only if absent, counting the keys of the claim range in the same transaction.
/// Alone there, the claim holds the lock; otherwise the caller's
/// [`look_ahead`] tells (and, for a waiter, whom to watch).
///
/// A count, not a sorted read: etcd counts from its index, while any sort
/// loads every key of the range from disk. Uncontended locks are the common
/// case and pay nothing more than the create.
///
/// # Cancel safety
/// Not cancel safe: a dropped create may have created the claim. Callers
/// keep a cleanup armed around it (see the backend's queued guard).
pub(crate) async fn create(
    conn: &Conn,
    lock_prefix: &str,
    key: &str,
    value: &str,
    lease: i64,
) -> Result<Created, LockError> {
    let what = "creating the lock key";
    let (start, end) = claim_range(lock_prefix);
    let count = GetOptions::new().with_range(end).with_count_only();
    // A stray claim of ours removed, at most this many times.
    let mut strays = 0;
    loop {
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then(vec![
                TxnOp::put(
                    key,
                    value,
                    Some(etcd_client::PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(start.clone(), Some(count.clone())),
            ])
            .or_else(vec![TxnOp::get(key, None)]);
        // Create-if-absent of our own key, answered with the key's state either
        // way: sending it twice gives the same outcome.
        let r = conn.txn(what, Retry::Any, txn).await?;
        let ops = r.op_responses();
        let (rev, alone) = if r.succeeded() {
            // The put is the transaction's only write: the transaction's
            // revision is the key's create revision.
            let rev = header_revision(what, r.header())?;
            let alone = matches!(ops.get(1), Some(TxnOpResponse::Get(g)) if g.count() == 1);
            (rev, alone)
        } else {
            // The key exists. Only a create whose answer was lost (retried by
            // the caller's loop) leaves our own value there; another value is
            // a stray claim of ours (another process cannot use our lease).
            match ops.first() {
                Some(TxnOpResponse::Get(g)) => match g.kvs().first() {
                    Some(kv) if kv.value() == value.as_bytes() => (kv.create_revision(), false),
                    // Our lease id, another value: a claim of this client that
                    // no acquisition holds (the caller's slot rules out a live
                    // one), left by an earlier attempt whose create landed
                    // after its cleanup had looked (its answer never came).
                    // Removed, if it is still that claim, and ours created.
                    Some(kv) if strays < 2 => {
                        strays += 1;
                        tracing::debug!(key, "polylock: removing a stray claim of this client");
                        let stray = kv.create_revision();
                        let remove = Txn::new()
                            .when(vec![Compare::create_revision(key, CompareOp::Equal, stray)])
                            .and_then(vec![TxnOp::delete(key, None)]);
                        conn.txn("removing a stray claim", Retry::Any, remove)
                            .await?;
                        continue;
                    }
                    Some(_) => {
                        return Err(unexpected(
                            what,
                            format!("`{key}` already exists with another owner"),
                        ))
                    }
                    None => {
                        return Err(unexpected(what, "the key vanished within the transaction"))
                    }
                },
                _ => return Err(unexpected(what, "the transaction answered without the key")),
            }
        };
        return Ok(Created { rev, alone });
    }
}

/// How a release went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// Our claim was deleted.
    Deleted,
    /// Our claim was already gone, and nobody holds the lock.
    AlreadyFree,
    /// Our claim is gone (or was never ours) and someone else holds.
    HeldByOther,
}

/// Deletes `key` if it is still our claim (same owner and create revision).
///
/// The owner is compared through the value, which may also carry a holder
/// description the lease does not know: the first transaction compares
/// the bare owner token (a claim taken without a description), and if the
/// key turns out to be this claim with a description after it, a second
/// one compares that exact value.
///
/// `may_have_deleted` is true while a delete is on its way or after one
/// got no answer, and false once every delete sent answered that it
/// deleted nothing: what an error (or a cancel) leaves there tells the
/// caller whether the claim may be gone by this release.
///
/// # Cancel safety
/// Cancel safe: the delete happened or not.
pub(crate) async fn release(
    conn: &Conn,
    lock_prefix: &str,
    key: &str,
    owner: OwnerToken,
    create_rev: i64,
    may_have_deleted: &mut bool,
) -> Result<Released, LockError> {
    let what = "releasing the lock";
    let mut expected = owner.to_string().into_bytes();
    loop {
        let (start, opts) = claims_options(lock_prefix, SortOrder::Ascend, PAGE, Values::Skip);
        let txn = Txn::new()
            .when(vec![
                Compare::value(key, CompareOp::Equal, expected.clone()),
                Compare::create_revision(key, CompareOp::Equal, create_rev),
            ])
            .and_then(vec![TxnOp::delete(key, None)])
            .or_else(vec![TxnOp::get(key, None), TxnOp::get(start, Some(opts))]);
        // Not repeatable: a second try after a delete that happened would
        // see the next holder and report Lost.
        *may_have_deleted = true;
        let r = conn.txn(what, Retry::NotSent, txn).await?;
        if r.succeeded() {
            return Ok(Released::Deleted);
        }
        // Answered: this transaction deleted nothing, whatever fails next.
        *may_have_deleted = false;
        let ops = r.op_responses();
        let found = match ops.first() {
            Some(TxnOpResponse::Get(g)) => g.kvs().first().and_then(Claim::from_kv),
            _ => return Err(unexpected(what, "the transaction answered without the key")),
        };
        if let Some(claim) = found {
            let ours = claim.create_rev == create_rev
                && claim.value != expected
                && parse_owner_value(&claim.value).is_some_and(|(o, _)| o == owner);
            if ours {
                // This very claim, described: delete it under its value.
                expected = claim.value;
                continue;
            }
            return Ok(Released::HeldByOther);
        }
        let head = match ops.get(1) {
            Some(TxnOpResponse::Get(g)) => first_in(lock_prefix, g),
            _ => {
                return Err(unexpected(
                    what,
                    "the transaction answered without the queue head",
                ))
            }
        };
        let someone = match head {
            Some(found) => found.is_some(),
            None => holder(conn, lock_prefix, Values::Skip).await?.is_some(),
        };
        return Ok(if someone {
            Released::HeldByOther
        } else {
            Released::AlreadyFree
        });
    }
}

/// How many keys one page of a [`holders_under`] read fetches.
const LIST_PAGE: i64 = 1000;

/// How many holders' values one transaction of [`holders_under`] reads
/// (etcd refuses transactions of more than 128 operations by default).
const VALUES_PER_TXN: usize = 64;

/// The end of the range of keys starting with `prefix` ("\0", all keys
/// from the start on, when nothing follows every such key).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&b| b < 0xff) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => vec![0],
    }
}

/// The lock name a claim key belongs to, if `kv` is a claim under
/// `prefix`: `{prefix}{name}/{hex lease id}`, attached to that very lease
/// (as both polylock and Go's Mutex write it), with a valid name.
fn claim_name(prefix: &str, kv: &KeyValue) -> Option<LockName> {
    let key = kv.key_str().ok()?.strip_prefix(prefix)?;
    let (name, hex) = key.rsplit_once('/')?;
    if kv.lease() == 0 || lease_of_key(hex) != Some(kv.lease()) {
        return None;
    }
    // The session's own key (`\0polylock-session/...`) fails here: a lock
    // name has no NUL.
    LockName::new(name).ok()
}

/// The holder of every lock whose name starts with `name_prefix` and whose
/// holder polylock put there (the claim value is ours), in name order, at
/// most `limit`: the claim with the lowest create revision per name, with
/// its value, all read at one revision.
///
/// Pages of keys only over `{prefix}{name_prefix}` first (the range may
/// hold any application's keys when the prefix is empty), then the values
/// of the holders alone, at the same revision.
///
/// # Cancel safety
/// Cancel safe: read only.
pub(crate) async fn holders_under(
    conn: &Conn,
    prefix: &str,
    name_prefix: &str,
    limit: usize,
) -> Result<Vec<(LockName, Claim)>, LockError> {
    let what = "listing the locks";
    if limit == 0 {
        return Ok(Vec::new());
    }
    let first = format!("{prefix}{name_prefix}");
    let end = prefix_end(first.as_bytes());
    let mut start = if first.is_empty() {
        vec![0]
    } else {
        first.into_bytes()
    };
    let mut at = 0;
    let mut lowest: std::collections::HashMap<LockName, Claim> = Default::default();
    loop {
        let opts = GetOptions::new()
            .with_range(end.clone())
            .with_keys_only()
            .with_limit(LIST_PAGE)
            .with_revision(at);
        let r = conn.get(what, start.clone(), Some(opts)).await?;
        if at == 0 {
            at = header_revision(what, r.header())?;
        }
        for kv in r.kvs() {
            let Some(name) = claim_name(prefix, kv) else {
                continue;
            };
            if !name.as_str().starts_with(name_prefix) {
                continue;
            }
            let Some(claim) = Claim::from_kv(kv) else {
                continue;
            };
            match lowest.entry(name) {
                std::collections::hash_map::Entry::Occupied(mut e) => {
                    if claim.create_rev < e.get().create_rev {
                        e.insert(claim);
                    }
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(claim);
                }
            }
        }
        match r.kvs().last() {
            Some(kv) if r.more() => {
                start = kv.key().to_vec();
                start.push(0);
            }
            _ => break,
        }
    }
    let mut candidates: Vec<(LockName, Claim)> = lowest.into_iter().collect();
    candidates.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for chunk in candidates.chunks(VALUES_PER_TXN) {
        let gets = chunk
            .iter()
            .map(|(_, c)| TxnOp::get(c.key.as_str(), Some(GetOptions::new().with_revision(at))))
            .collect::<Vec<_>>();
        let r = conn
            .txn(what, Retry::Any, Txn::new().and_then(gets))
            .await?;
        for ((name, claim), op) in chunk.iter().zip(r.op_responses()) {
            let TxnOpResponse::Get(g) = op else {
                return Err(unexpected(what, "the transaction answered without a value"));
            };
            let Some(kv) = g.kvs().first() else { continue };
            let ours =
                kv.create_revision() == claim.create_rev && parse_owner_value(kv.value()).is_some();
            if ours {
                if let Some(c) = Claim::from_kv(kv) {
                    out.push((name.clone(), c));
                }
                if out.len() >= limit {
                    return Ok(out);
                }
            }
        }
    }
    Ok(out)
}

/// How many claims lock `lock_prefix` has (holder and waiters, polylock's
/// and foreign ones).
///
/// # Cancel safety
/// Cancel safe: read only.
pub(crate) async fn claim_count(conn: &Conn, lock_prefix: &str) -> Result<usize, LockError> {
    let (start, end) = claim_range(lock_prefix);
    // Keys of longer names may share the range: a count alone cannot
    // tell them apart, so read the keys.
    let opts = GetOptions::new().with_range(end).with_keys_only();
    let r = conn.get("counting the waiters", start, Some(opts)).await?;
    Ok(r.kvs()
        .iter()
        .filter(|kv| is_claim(lock_prefix, kv.key()))
        .count())
}

/// Deletes the claim `key` created at `create_rev`; whether it existed. For
/// a claim this client holds: its value is not compared (see the backend's
/// release), but its revision is, since the same key may be created again
/// by this client once the claim is gone (its lease reaped, the slot freed)
/// while this delete is on its way.
///
/// # Cancel safety
/// Cancel safe: the delete happened or not.
pub(crate) async fn delete_own(conn: &Conn, key: &str, create_rev: i64) -> Result<bool, LockError> {
    let txn = Txn::new()
        .when(vec![Compare::create_revision(
            key,
            CompareOp::Equal,
            create_rev,
        )])
        .and_then(vec![TxnOp::delete(key, None)]);
    // Not repeated after an unclear failure: a second delete would find
    // nothing and make a clean release look like a lost one.
    let r = conn.txn("releasing the lock", Retry::NotSent, txn).await?;
    Ok(r.succeeded())
}

/// How waiting for a delete ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WatchEnd {
    /// The key was deleted.
    Deleted,
    /// The watch ended without telling (compaction, cancel, stream end):
    /// read the queue again.
    Recheck,
}

/// Waits until `key` (seen by a read at revision `seen_at`) is deleted, or
/// changed since that read (deleted and created again), on a watch of its
/// own: for a key that is watched once and long (a session's sentinel),
/// not for queue waits, which share their lock's watch (see
/// [`crate::watch`]). Runs until the delete or the stream's end; callers
/// race it against their deadline.
///
/// The watch starts at the server's current revision, never at
/// `seen_at + 1`: etcd serves a watch whose start revision has already
/// passed from its "unsynced" group, which a background loop catches up
/// only every 100 ms. The created answer tells from which revision it
/// covers, and only if writes landed since `seen_at` does one read check
/// that the key outlived them (see [`watch_covers`]).
///
/// # Cancel safety
/// Cancel safe: dropping it closes the watch stream.
pub(crate) async fn wait_deleted(
    conn: &Conn,
    key: &str,
    seen_at: i64,
) -> Result<WatchEnd, LockError> {
    let what = "watching a key";
    let opts = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
    let mut stream = conn.watch(key, opts).await?;
    loop {
        match stream.message().await {
            Ok(Some(r)) => {
                if r.events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return Ok(WatchEnd::Deleted);
                }
                if r.canceled() || r.compact_revision() != 0 {
                    return Ok(WatchEnd::Recheck);
                }
                if r.created() {
                    let from = header_revision(what, r.header())?;
                    // Writes landed between our read and the watch; the
                    // delete may be one of them. Unchanged since the read
                    // (not a new key under the same name) means any delete
                    // comes later, inside the watch.
                    if !watch_covers(seen_at, from) && !unchanged_since(conn, key, seen_at).await? {
                        return Ok(WatchEnd::Deleted);
                    }
                }
            }
            Ok(None) => return Ok(WatchEnd::Recheck),
            Err(e) => return Err(crate::errors::from_etcd(what, e)),
        }
    }
}

/// How waiting behind the last claim ahead ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LastEnd {
    /// The claim ahead was deleted while ours still existed: ours is the
    /// lowest, on a live lease, as of that delete.
    Mine,
    /// Read the queue again (our claim may be gone, the watch ended, or
    /// the queue changed before the watch started).
    Recheck,
}

/// Waits until one of `keys` (claims ahead of ours, seen by a read at
/// revision `seen_at`) is deleted, on the lock's shared watch `sub` (made
/// ready before that read, so no later delete is missed).
///
/// # Cancel safety
/// Cancel safe.
pub(crate) async fn wait_ahead_deleted(
    sub: &mut Subscription,
    keys: &[&str],
    seen_at: i64,
) -> WatchEnd {
    loop {
        match sub.next(seen_at).await {
            Note::Recheck => return WatchEnd::Recheck,
            Note::Deleted { keys: gone, .. } if gone.iter().any(|k| keys.contains(&&**k)) => {
                return WatchEnd::Deleted
            }
            Note::Deleted { .. } => {}
        }
    }
}

/// Waits behind `ahead.pred`, the only claim ahead of ours (`key`, created
/// at `my_rev` on `lease`), and answers [`LastEnd::Mine`] at its delete
/// without reading the queue again: nothing can queue ahead of us any more
/// (later claims sort after ours), so that delete makes ours the lowest,
/// provided ours still exists at that revision.
///
/// The lock's shared watch `sub` (ready before the read that made `ahead`)
/// carries every delete of the claim range after that read, in revision
/// order and one note per revision, so "ours was not deleted before or
/// with its predecessor" is decided by the notes, never by timing. Deletes
/// of other keys (other claims, keys of longer names) are skipped.
///
/// # Cancel safety
/// Cancel safe.
pub(crate) async fn wait_last(
    sub: &mut Subscription,
    key: &str,
    my_rev: i64,
    lease: i64,
    ahead: &Ahead,
) -> LastEnd {
    let Some(pred) = ahead.pred.as_ref().filter(|_| ahead.only) else {
        return LastEnd::Recheck;
    };
    if !ahead.is_mine(key, my_rev, lease) {
        return LastEnd::Recheck;
    }
    loop {
        match sub.next(ahead.rev).await {
            Note::Recheck => return LastEnd::Recheck,
            // Ours went first, or in the same revision as the claim ahead
            // (a range delete, `etcdctl del --prefix`): read again (the
            // read finds it gone).
            Note::Deleted { keys, .. } if keys.iter().any(|k| **k == *key) => {
                return LastEnd::Recheck
            }
            Note::Deleted { keys, .. } if keys.iter().any(|k| **k == *pred.key) => {
                return LastEnd::Mine
            }
            Note::Deleted { .. } => {}
        }
    }
}

/// Whether `key` exists, last written at or before revision `rev`.
///
/// # Cancel safety
/// Cancel safe: read only.
async fn unchanged_since(conn: &Conn, key: &str, rev: i64) -> Result<bool, LockError> {
    let r = conn
        .get(
            "checking the claim ahead in the queue",
            key,
            Some(GetOptions::new().with_keys_only()),
        )
        .await?;
    Ok(r.kvs().first().is_some_and(|kv| kv.mod_revision() <= rev))
}

/// Whether a watch whose created answer carries revision `watch_rev` (etcd
/// sends every event after it) sees every change after a read at revision
/// `seen_at`: only if nothing was written in between.
pub(crate) fn watch_covers(seen_at: i64, watch_rev: i64) -> bool {
    watch_rev <= seen_at
}

fn header_revision(
    what: &str,
    header: Option<&etcd_client::ResponseHeader>,
) -> Result<i64, LockError> {
    header
        .map(|h| h.revision())
        .ok_or_else(|| unexpected(what.to_string(), "the answer has no header"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_covers_a_read_only_if_nothing_was_written_between() {
        assert!(
            watch_covers(41, 41),
            "same revision: the watch sees all after the read"
        );
        assert!(watch_covers(41, 40), "a member behind the read's revision");
        assert!(
            !watch_covers(41, 42),
            "one write between: it may be the delete"
        );
    }

    async fn etcd_conn(server: &testkit::EtcdServer) -> Conn {
        let client = etcd_client::Client::connect([server.endpoint()], None)
            .await
            .unwrap();
        Conn::new(&client, std::time::Duration::from_secs(5))
    }

    async fn put(conn: &Conn, key: &str) -> Claim {
        let txn = Txn::new().and_then(vec![TxnOp::put(key, "v", None)]);
        conn.txn("test put", Retry::Any, txn).await.unwrap();
        claim_of(conn, key).await.unwrap().unwrap()
    }

    /// The race the watch-from-now design must close: the predecessor's
    /// delete lands after the read that found it and before the watch
    /// exists. The waiter must still wake, from the check read.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_between_the_read_and_the_watch_is_not_missed() {
        let server = testkit::EtcdServer::start().unwrap();
        let conn = etcd_conn(&server).await;
        let ahead = put(&conn, "q/ahead").await;
        let seen_at = claim_of_rev(&conn, "q/ahead").await;
        assert!(delete_own(&conn, "q/ahead", ahead.create_rev)
            .await
            .unwrap());
        let ended = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            wait_deleted(&conn, &ahead.key, seen_at),
        )
        .await
        .expect("the waiter wakes although the delete came before its watch");
        assert_eq!(ended.unwrap(), WatchEnd::Deleted);

        // The key deleted and created again (a new claim under the same
        // key) before the watch: still a delete of the claim we waited for.
        let ahead = put(&conn, "q/again").await;
        let seen_at = claim_of_rev(&conn, "q/again").await;
        assert!(delete_own(&conn, "q/again", ahead.create_rev)
            .await
            .unwrap());
        let again = put(&conn, "q/again").await;
        assert_ne!(again.create_rev, ahead.create_rev);
        // A late delete of the first claim leaves the second alone.
        assert!(!delete_own(&conn, "q/again", ahead.create_rev)
            .await
            .unwrap());
        assert!(claim_of(&conn, "q/again").await.unwrap().is_some());
        let ended = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            wait_deleted(&conn, &ahead.key, seen_at),
        )
        .await
        .expect("the waiter wakes");
        assert_eq!(ended.unwrap(), WatchEnd::Deleted);

        // Writes elsewhere between the read and the watch, the claim still
        // there: the waiter keeps waiting and wakes at the real delete.
        let ahead = put(&conn, "q/held").await;
        let seen_at = claim_of_rev(&conn, "q/held").await;
        put(&conn, "q/other").await;
        let waiting = tokio::spawn({
            let (conn, ahead) = (conn.clone(), ahead.clone());
            async move { wait_deleted(&conn, &ahead.key, seen_at).await }
        });
        // Long enough for the created answer and the check read.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert!(!waiting.is_finished(), "woke while the claim is held");
        assert!(delete_own(&conn, "q/held", ahead.create_rev).await.unwrap());
        let ended = tokio::time::timeout(std::time::Duration::from_secs(30), waiting)
            .await
            .expect("the waiter wakes at the delete")
            .unwrap();
        assert_eq!(ended.unwrap(), WatchEnd::Deleted);
    }

    async fn claim_of_rev(conn: &Conn, key: &str) -> i64 {
        let r = conn.get("test read", key, None).await.unwrap();
        header_revision("test read", r.header()).unwrap()
    }

    #[test]
    fn layout_matches_go_concurrency_mutex() {
        let name = LockName::new("jobs/nightly").unwrap();
        let pfx = lock_prefix("", &name);
        assert_eq!(pfx, "jobs/nightly/");
        // Go: fmt.Sprintf("%s%x", "jobs/nightly/", int64(0x694d7a1b2c3d4e5f))
        assert_eq!(
            claim_key(&pfx, 0x694d_7a1b_2c3d_4e5f),
            "jobs/nightly/694d7a1b2c3d4e5f"
        );
        assert_eq!(claim_key(&pfx, 10), "jobs/nightly/a");
        assert_eq!(
            lease_of_key("jobs/nightly/694d7a1b2c3d4e5f"),
            Some(0x694d_7a1b_2c3d_4e5f)
        );
        assert_eq!(lease_of_key("jobs/nightly/"), None);
        assert_eq!(lease_of_key("jobs/nightly/XYZ"), None);
        assert_eq!(
            lock_prefix("app/", &LockName::new("ключ 🔒").unwrap()),
            "app/ключ 🔒/"
        );
    }

    #[test]
    fn claims_of_longer_names_are_not_claims() {
        let pfx = "a/";
        assert!(is_claim(pfx, b"a/694d7a1b2c3d4e5f"));
        assert!(is_claim(pfx, b"a/1"));
        assert!(!is_claim(pfx, b"a/b/694d7a1b2c3d4e5f"), "a claim on a/b");
        assert!(!is_claim(pfx, b"a/abc/1"), "a claim on a/abc");
        assert!(!is_claim(pfx, b"a/"));
        assert!(!is_claim(pfx, b"a/ABC"));
        assert!(!is_claim(pfx, b"a/12345678901234567"), "longer than an i64");
        assert!(!is_claim(pfx, b"ab/1"));
        let (start, end) = claim_range(pfx);
        for key in ["a/0", "a/9", "a/a", "a/f", "a/ffffffffffffffff"] {
            assert!(key >= start.as_str() && key < end.as_str(), "{key}");
        }
    }
}
