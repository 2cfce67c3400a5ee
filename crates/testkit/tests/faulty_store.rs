//! Behaviour of every fault the `FaultyStore` can inject, checked against the inner store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::TryStreamExt;
use glidefs_testkit::{is_injected, Fault, FaultRule, FaultyStore, Op};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

fn io_kind(err: &object_store::Error) -> Option<std::io::ErrorKind> {
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        source = e.source();
    }
    None
}

fn setup() -> (Arc<InMemory>, FaultyStore) {
    let inner = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(inner.clone() as Arc<dyn ObjectStore>);
    (inner, faulty)
}

fn payload(s: &'static [u8]) -> PutPayload {
    PutPayload::from_static(s)
}

#[tokio::test]
async fn transient_fault_hits_next_n_calls_then_clears() {
    let (inner, faulty) = setup();
    faulty.inject(FaultRule::new(Fault::Transient).ops(&[Op::Put]).times(2));
    let p = Path::from("a");
    for _ in 0..2 {
        let err = faulty.put(&p, payload(b"x")).await.unwrap_err();
        assert!(is_injected(&err));
        assert_eq!(io_kind(&err), Some(std::io::ErrorKind::ConnectionReset));
        assert!(inner.head(&p).await.is_err(), "a failed put must not land");
    }
    faulty
        .put(&p, payload(b"x"))
        .await
        .expect("third put passes");
    assert_eq!(inner.get(&p).await.unwrap().bytes().await.unwrap(), "x");
    let counts = faulty.counts();
    assert_eq!(counts.calls(Op::Put), 3);
    assert_eq!(counts.faults_injected, 2);
    assert_eq!(counts.put_bytes, 1);
}

/// `after(k)` lets the first `k` matching calls through; non-matching calls do not count.
#[tokio::test]
async fn after_skips_matching_calls_before_the_trigger() {
    let (inner, faulty) = setup();
    faulty.inject(
        FaultRule::new(Fault::Transient)
            .ops(&[Op::Put])
            .path_contains("m/")
            .after(2)
            .times(1),
    );
    faulty.put(&Path::from("x"), payload(b"x")).await.unwrap();
    for name in ["m/1", "m/2"] {
        faulty.put(&Path::from(name), payload(b"x")).await.unwrap();
    }
    let err = faulty
        .put(&Path::from("m/3"), payload(b"x"))
        .await
        .unwrap_err();
    assert!(is_injected(&err), "the third matching put fails");
    assert!(inner.head(&Path::from("m/3")).await.is_err());
    faulty.put(&Path::from("m/4"), payload(b"x")).await.unwrap();
    assert_eq!(faulty.counts().faults_injected, 1);
}

#[tokio::test]
async fn permanent_fault_is_permission_denied_and_path_filtered() {
    let (_inner, faulty) = setup();
    faulty.inject(FaultRule::new(Fault::Permanent).path_contains("manifest"));
    let err = faulty
        .put(&Path::from("v/manifest/1"), payload(b"m"))
        .await
        .unwrap_err();
    assert_eq!(io_kind(&err), Some(std::io::ErrorKind::PermissionDenied));
    let err = faulty.put(&Path::from("v/manifest/2"), payload(b"m")).await;
    assert!(err.is_err(), "an untimed rule keeps firing");
    faulty
        .put(&Path::from("v/packs/1"), payload(b"p"))
        .await
        .expect("other paths are untouched");
    faulty.clear_faults();
    faulty
        .put(&Path::from("v/manifest/3"), payload(b"m"))
        .await
        .expect("cleared");
}

#[tokio::test]
async fn lost_ack_applies_the_put_but_reports_failure() {
    let (inner, faulty) = setup();
    faulty.inject(FaultRule::new(Fault::LostAck).ops(&[Op::Put]).times(1));
    let p = Path::from("lost");
    let err = faulty.put(&p, payload(b"data")).await.unwrap_err();
    assert!(is_injected(&err));
    assert_eq!(io_kind(&err), Some(std::io::ErrorKind::ConnectionReset));
    let stored = inner
        .get(&p)
        .await
        .expect("object landed")
        .bytes()
        .await
        .unwrap();
    assert_eq!(stored, "data");
}

#[tokio::test]
async fn fail_after_bytes_breaks_puts_and_truncates_gets() {
    let (inner, faulty) = setup();
    let p = Path::from("big");
    faulty.inject(
        FaultRule::new(Fault::FailAfterBytes(10))
            .ops(&[Op::Put])
            .times(1),
    );
    let data = Bytes::from((0..100u8).collect::<Vec<_>>());
    assert!(faulty.put(&p, data.clone().into()).await.is_err());
    assert!(
        inner.head(&p).await.is_err(),
        "broken upload leaves nothing"
    );

    faulty.put(&p, data.clone().into()).await.unwrap();
    faulty.inject(
        FaultRule::new(Fault::FailAfterBytes(10))
            .ops(&[Op::Get])
            .times(1),
    );
    let chunks = faulty
        .get(&p)
        .await
        .unwrap()
        .into_stream()
        .collect_partial()
        .await;
    assert_eq!(chunks.0, data.slice(..10), "first 10 bytes arrive");
    assert!(
        chunks.1.is_some_and(|e| is_injected(&e)),
        "then the stream fails"
    );
    let full = faulty.get(&p).await.unwrap().bytes().await.unwrap();
    assert_eq!(full, data);
}

/// Collects a stream until its first error.
trait CollectPartial {
    async fn collect_partial(self) -> (Bytes, Option<object_store::Error>);
}

impl CollectPartial for futures::stream::BoxStream<'static, object_store::Result<Bytes>> {
    async fn collect_partial(mut self) -> (Bytes, Option<object_store::Error>) {
        let mut out = Vec::new();
        loop {
            match self.try_next().await {
                Ok(Some(b)) => out.extend_from_slice(&b),
                Ok(None) => return (out.into(), None),
                Err(e) => return (out.into(), Some(e)),
            }
        }
    }
}

#[tokio::test]
async fn flip_bit_corrupts_exactly_one_bit_of_a_ranged_get() {
    let (_inner, faulty) = setup();
    let p = Path::from("obj");
    faulty
        .put(&p, Bytes::from(vec![0u8; 64]).into())
        .await
        .unwrap();
    faulty.inject(
        FaultRule::new(Fault::FlipBit { byte: 3 })
            .ops(&[Op::Get])
            .times(1),
    );
    let got = faulty.get_range(&p, 8..24).await.unwrap();
    let mut expected = [0u8; 16];
    expected[3] = 1;
    assert_eq!(&got[..], &expected[..]);
    assert_eq!(faulty.get_range(&p, 8..24).await.unwrap(), vec![0u8; 16]);
    assert_eq!(faulty.counts().get_bytes, 32);
}

#[tokio::test]
async fn seeded_probability_is_reproducible_and_roughly_p() {
    async fn run(seed: u64) -> Vec<bool> {
        let faulty =
            FaultyStore::with_seed(Arc::new(InMemory::new()) as Arc<dyn ObjectStore>, seed);
        faulty.inject(FaultRule::new(Fault::Transient).probability(0.3));
        let mut outcomes = Vec::new();
        for i in 0..200 {
            let p = Path::from(format!("k{i}"));
            outcomes.push(faulty.put(&p, payload(b"v")).await.is_err());
        }
        outcomes
    }
    let a = run(42).await;
    assert_eq!(a, run(42).await, "same seed, same faults");
    let failures = a.iter().filter(|f| **f).count();
    assert!(
        (30..=90).contains(&failures),
        "p=0.3 over 200 calls gave {failures}"
    );
}

#[tokio::test]
async fn list_delete_head_faults_and_latency() {
    let (inner, faulty) = setup();
    faulty.put(&Path::from("d/a"), payload(b"1")).await.unwrap();
    faulty.put(&Path::from("d/b"), payload(b"2")).await.unwrap();

    faulty.inject(FaultRule::new(Fault::Transient).ops(&[Op::List]).times(1));
    let err = faulty
        .list(Some(&Path::from("d")))
        .try_collect::<Vec<_>>()
        .await
        .unwrap_err();
    assert!(is_injected(&err));
    let listed = faulty
        .list(Some(&Path::from("d")))
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    assert_eq!(listed.len(), 2);

    faulty.inject(FaultRule::new(Fault::Transient).ops(&[Op::Head]).times(1));
    assert!(faulty.head(&Path::from("d/a")).await.is_err());
    assert!(faulty.head(&Path::from("d/a")).await.is_ok());

    faulty.inject(FaultRule::new(Fault::Permanent).ops(&[Op::Delete]).times(1));
    assert!(faulty.delete(&Path::from("d/a")).await.is_err());
    assert!(
        inner.head(&Path::from("d/a")).await.is_ok(),
        "failed delete kept it"
    );
    faulty.delete(&Path::from("d/a")).await.unwrap();
    assert!(inner.head(&Path::from("d/a")).await.is_err());

    faulty.set_latency(Duration::from_millis(30));
    let start = Instant::now();
    faulty.head(&Path::from("d/b")).await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(30),
        "latency applied"
    );
    let counts = faulty.counts();
    assert_eq!(counts.calls(Op::List), 2);
    assert_eq!(counts.calls(Op::Head), 3);
    assert_eq!(counts.calls(Op::Delete), 2);
}

#[tokio::test]
async fn copy_and_delete_faults_reach_the_inner_store_only_for_lost_acks() {
    let (inner, faulty) = setup();
    let (src, dst) = (Path::from("c/src"), Path::from("c/dst"));
    faulty.put(&src, payload(b"copy me")).await.unwrap();

    faulty.inject(FaultRule::new(Fault::Permanent).ops(&[Op::Copy]).times(1));
    assert!(is_injected(&faulty.copy(&src, &dst).await.unwrap_err()));
    assert!(inner.head(&dst).await.is_err(), "failed copy wrote nothing");

    faulty.inject(FaultRule::new(Fault::LostAck).ops(&[Op::Copy]).times(1));
    assert!(is_injected(&faulty.copy(&src, &dst).await.unwrap_err()));
    let copied = inner.get(&dst).await.unwrap().bytes().await.unwrap();
    assert_eq!(&copied[..], b"copy me", "lost-ack copy took effect");

    faulty.inject(FaultRule::new(Fault::LostAck).ops(&[Op::Delete]).times(1));
    assert!(is_injected(&faulty.delete(&dst).await.unwrap_err()));
    assert!(
        inner.head(&dst).await.is_err(),
        "lost-ack delete took effect"
    );
    assert_eq!(faulty.counts().faults_injected, 3);
}

fn io_kind_of(err: &object_store::Error) -> std::io::ErrorKind {
    io_kind(err).expect("an injected error carries an io::Error")
}

/// Stalls and timeouts take tokio time (paused here: an hour passes at once); a stall then
/// goes through, a timeout fails with `TimedOut` and never reaches the store.
#[tokio::test(start_paused = true)]
async fn stall_delays_and_timeout_fails_after_the_delay_in_tokio_time() {
    let (inner, faulty) = setup();
    let p = Path::from("slow");
    faulty.inject(
        FaultRule::new(Fault::Stall(Duration::from_secs(3600)))
            .ops(&[Op::Put])
            .times(1),
    );
    let t0 = tokio::time::Instant::now();
    faulty.put(&p, payload(b"s")).await.expect("a stall ends");
    assert!(t0.elapsed() >= Duration::from_secs(3600));
    assert_eq!(inner.get(&p).await.unwrap().bytes().await.unwrap(), "s");

    faulty.inject(
        FaultRule::new(Fault::Timeout(Duration::from_secs(30)))
            .ops(&[Op::Put, Op::Get])
            .times(2),
    );
    let t1 = tokio::time::Instant::now();
    let q = Path::from("timed-out");
    let err = faulty.put(&q, payload(b"t")).await.unwrap_err();
    assert!(is_injected(&err));
    assert_eq!(io_kind_of(&err), std::io::ErrorKind::TimedOut);
    assert!(inner.head(&q).await.is_err(), "a timed-out put never lands");
    let err = faulty.get(&p).await.unwrap_err();
    assert_eq!(io_kind_of(&err), std::io::ErrorKind::TimedOut);
    assert!(t1.elapsed() >= Duration::from_secs(60));
    assert_eq!(faulty.counts().faults_injected, 3);
}

/// A held call waits until released, then goes through; calls after the rule ran out pass.
#[tokio::test(start_paused = true)]
async fn held_calls_wait_for_release() {
    let (inner, faulty) = setup();
    let faulty = Arc::new(faulty);
    faulty.inject(FaultRule::new(Fault::Hold).ops(&[Op::Put]).times(2));
    let puts: Vec<_> = ["h1", "h2"]
        .into_iter()
        .map(|k| {
            let faulty = faulty.clone();
            tokio::spawn(async move { faulty.put(&Path::from(k), payload(b"h")).await })
        })
        .collect();
    faulty.wait_held(2).await;
    assert_eq!(faulty.plan().held(), 2);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(
        inner.head(&Path::from("h1")).await.is_err(),
        "held: not landed"
    );
    faulty
        .put(&Path::from("h3"), payload(b"h"))
        .await
        .expect("the rule ran out: not held");
    faulty.release_held();
    for p in puts {
        p.await.unwrap().expect("released puts go through");
    }
    assert_eq!(faulty.plan().held(), 0);
    assert!(inner.head(&Path::from("h2")).await.is_ok());
}

/// A held call whose caller is dropped (a task aborted: a simulated crash) is no longer
/// counted, so the next `wait_held(1)` waits for a call that is really held.
#[tokio::test(start_paused = true)]
async fn a_dropped_held_call_is_no_longer_counted() {
    let (inner, faulty) = setup();
    let faulty = Arc::new(faulty);
    faulty.inject(FaultRule::new(Fault::Hold).ops(&[Op::Put]).times(1));
    let put = {
        let faulty = faulty.clone();
        tokio::spawn(async move { faulty.put(&Path::from("a"), payload(b"a")).await })
    };
    faulty.wait_held(1).await;
    put.abort();
    assert!(put.await.unwrap_err().is_cancelled());
    assert_eq!(faulty.plan().held(), 0, "the aborted call is not held");
    faulty.release_held();
    assert!(
        inner.head(&Path::from("a")).await.is_err(),
        "it never landed"
    );
    faulty.inject(FaultRule::new(Fault::Hold).ops(&[Op::Put]).times(1));
    let second = {
        let faulty = faulty.clone();
        tokio::spawn(async move { faulty.put(&Path::from("b"), payload(b"b")).await })
    };
    faulty.wait_held(1).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        inner.head(&Path::from("b")).await.is_err(),
        "wait_held returned for a call really held"
    );
    faulty.release_held();
    second.await.unwrap().expect("released");
    assert!(inner.head(&Path::from("b")).await.is_ok());
}

/// An outage refuses every call (retryable `ConnectionRefused`, nothing reaches the store)
/// until switched off or its tokio-time window ends; rules are not consulted meanwhile.
#[tokio::test(start_paused = true)]
async fn outages_refuse_every_call_until_lifted_or_expired() {
    let (inner, faulty) = setup();
    let p = Path::from("o");
    faulty.put(&p, payload(b"o")).await.unwrap();
    faulty.set_outage(true);
    for op in ["put", "get", "head", "list", "delete"] {
        let err = match op {
            "put" => faulty.put(&Path::from("new"), payload(b"n")).await.err(),
            "get" => faulty.get(&p).await.err(),
            "head" => faulty.head(&p).await.err(),
            "list" => faulty.list(None).try_collect::<Vec<_>>().await.err(),
            _ => faulty.delete(&p).await.err(),
        }
        .unwrap_or_else(|| panic!("{op} must fail during an outage"));
        assert!(is_injected(&err), "{op}: {err}");
        assert_eq!(io_kind_of(&err), std::io::ErrorKind::ConnectionRefused);
    }
    assert!(inner.head(&p).await.is_ok(), "the delete never landed");
    assert!(inner.head(&Path::from("new")).await.is_err());
    faulty.set_outage(false);
    faulty.get(&p).await.expect("back up");

    faulty.outage_for(Duration::from_secs(120));
    assert!(faulty.get(&p).await.is_err());
    tokio::time::sleep(Duration::from_secs(119)).await;
    assert!(faulty.get(&p).await.is_err(), "still down at 119 s");
    tokio::time::sleep(Duration::from_secs(2)).await;
    faulty.get(&p).await.expect("up after 120 s");
}

/// `then_outage`: the put lands, its reply is lost, and the store is gone for the retries.
#[tokio::test]
async fn a_lost_reply_can_take_the_store_down() {
    let (inner, faulty) = setup();
    faulty.inject(
        FaultRule::new(Fault::LostAck)
            .ops(&[Op::Put])
            .path_contains("manifest")
            .times(1)
            .then_outage(),
    );
    faulty
        .put(&Path::from("pack"), payload(b"p"))
        .await
        .unwrap();
    let m = Path::from("manifest/1");
    let err = faulty.put(&m, payload(b"m")).await.unwrap_err();
    assert_eq!(io_kind_of(&err), std::io::ErrorKind::ConnectionReset);
    assert!(inner.head(&m).await.is_ok(), "it landed");
    let err = faulty.get(&m).await.unwrap_err();
    assert_eq!(io_kind_of(&err), std::io::ErrorKind::ConnectionRefused);
    faulty.set_outage(false);
    faulty.get(&m).await.expect("back up");
    assert_eq!(faulty.plan().calls(Op::Put), 2);
    assert_eq!(faulty.plan().calls(Op::Get), 2);
}

/// A held listing lists the store as it is when the call goes on, not when it was made.
#[tokio::test(start_paused = true)]
async fn a_held_listing_sees_what_landed_during_the_hold() {
    let (inner, faulty) = setup();
    let faulty = Arc::new(faulty);
    faulty.put(&Path::from("d/1"), payload(b"1")).await.unwrap();
    faulty.inject(FaultRule::new(Fault::Hold).ops(&[Op::List]).times(1));
    let listing = {
        let faulty = faulty.clone();
        tokio::spawn(async move {
            faulty
                .list(Some(&Path::from("d")))
                .try_collect::<Vec<_>>()
                .await
        })
    };
    faulty.wait_held(1).await;
    inner.put(&Path::from("d/2"), payload(b"2")).await.unwrap();
    faulty.release_held();
    let listed = listing.await.unwrap().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
}

/// A stale listing finds nothing (every form of listing), the next one finds what is there;
/// other operations go through.
#[tokio::test]
async fn an_empty_list_fault_hides_the_objects_from_that_listing_only() {
    let (_inner, faulty) = setup();
    let d = Path::from("d");
    faulty.put(&Path::from("d/1"), payload(b"1")).await.unwrap();
    faulty.inject(FaultRule::new(Fault::EmptyList).times(3));
    faulty
        .put(&Path::from("d/2"), payload(b"2"))
        .await
        .expect("not a listing: goes through");
    let stale = faulty.list(Some(&d)).try_collect::<Vec<_>>().await.unwrap();
    assert!(stale.is_empty(), "{stale:?}");
    let stale = faulty.list_with_delimiter(Some(&d)).await.unwrap();
    assert!(stale.objects.is_empty() && stale.common_prefixes.is_empty());
    assert_eq!(faulty.counts().faults_injected, 3, "the put used one");
    let listed = faulty.list(Some(&d)).try_collect::<Vec<_>>().await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(
        faulty
            .list_with_delimiter(Some(&d))
            .await
            .unwrap()
            .objects
            .len(),
        2
    );
}

#[tokio::test]
async fn a_late_put_or_delete_lands_only_when_landed_after_what_ran_meanwhile() {
    let (inner, faulty) = setup();
    let (a, b) = (Path::from("a"), Path::from("b"));
    inner.put(&b, payload(b"old")).await.unwrap();
    faulty.inject(FaultRule::new(Fault::Late).ops(&[Op::Put]).times(1));
    faulty.inject(FaultRule::new(Fault::Late).ops(&[Op::Delete]).times(1));
    let err = faulty.put(&a, payload(b"late")).await.unwrap_err();
    assert!(is_injected(&err));
    assert_eq!(io_kind(&err), Some(std::io::ErrorKind::TimedOut));
    let err = faulty.delete(&b).await.unwrap_err();
    assert_eq!(io_kind(&err), Some(std::io::ErrorKind::TimedOut));
    // Nothing happened yet: the put is not there, the object to delete is.
    assert!(inner.get(&a).await.is_err());
    assert_eq!(faulty.late_calls(), 2);
    // Meanwhile the caller's retry wrote `a`, and another writer replaced `b`.
    faulty.put(&a, payload(b"retry")).await.unwrap();
    faulty.put(&b, payload(b"new")).await.unwrap();
    assert_eq!(faulty.land_late(false).await, 2);
    assert_eq!(faulty.late_calls(), 0);
    // The late put overwrote the retry, the late delete took the newer `b`.
    let got = inner.get(&a).await.unwrap().bytes().await.unwrap();
    assert_eq!(&got[..], b"late");
    assert!(inner.get(&b).await.is_err());
    assert_eq!(faulty.land_late(false).await, 0);
}

#[tokio::test]
async fn late_calls_land_reversed_and_a_late_conditional_put_is_judged_when_it_lands() {
    let (inner, faulty) = setup();
    let p = Path::from("m");
    faulty.inject(FaultRule::new(Fault::Late).ops(&[Op::Put]).times(2));
    let create = object_store::PutOptions::from(object_store::PutMode::Create);
    faulty
        .put_opts(&p, payload(b"first"), create.clone())
        .await
        .unwrap_err();
    faulty.put(&p, payload(b"second")).await.unwrap_err();
    // Reversed: the unconditional put lands first, so the create finds the object and is
    // refused (its error goes nowhere).
    assert_eq!(faulty.land_late(true).await, 2);
    let got = inner.get(&p).await.unwrap().bytes().await.unwrap();
    assert_eq!(&got[..], b"second");
    // A late GET fails at once and never reaches the store.
    faulty.inject(FaultRule::new(Fault::Late).ops(&[Op::Get]).times(1));
    let err = faulty.get(&p).await.unwrap_err();
    assert_eq!(io_kind(&err), Some(std::io::ErrorKind::TimedOut));
    assert_eq!(faulty.late_calls(), 0);
}
