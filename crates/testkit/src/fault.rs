//! Fault descriptions for [`FaultyStore`](crate::FaultyStore): which calls a rule matches, when
//! it fires, what it does, and the error an injected fault produces.
//!
//! Injected errors are ordinary `object_store::Error::Generic` values whose source is a
//! `std::io::Error` with a telling kind, wrapping an [`InjectedFault`]:
//! - [`Fault::Transient`], [`Fault::LostAck`], [`Fault::FailAfterBytes`]: `ConnectionReset`
//!   (a caller should classify this as retryable),
//! - [`Fault::Permanent`]: `PermissionDenied` (a caller must not retry).
//!
//! [`is_injected`] tells an injected error from a real one.

const STORE_NAME: &str = "FaultyStore";

/// The kind of object store call a rule or counter refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `put_opts` (single-shot upload).
    Put,
    /// `put_multipart_opts` (start of a multipart upload).
    PutMultipart,
    /// `get_opts` without `head` (includes ranged gets).
    Get,
    /// `get_opts` with `head` set (`ObjectStoreExt::head`).
    Head,
    /// `list`, `list_with_offset`, `list_with_delimiter`.
    List,
    /// One path of `delete_stream` (`ObjectStoreExt::delete`).
    Delete,
    /// `copy_opts` (and renames, which copy then delete).
    Copy,
}

impl Op {
    pub(crate) const ALL: [Op; 7] = [
        Op::Put,
        Op::PutMultipart,
        Op::Get,
        Op::Head,
        Op::List,
        Op::Delete,
        Op::Copy,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// What an injected fault does to the call it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail without touching the inner store; retryable (`io::ErrorKind::ConnectionReset`).
    Transient,
    /// Fail without touching the inner store; not retryable (`io::ErrorKind::PermissionDenied`).
    Permanent,
    /// Perform the call on the inner store, then report a retryable error anyway (the
    /// acknowledgement was lost on the way back).
    LostAck,
    /// The transfer breaks after this many bytes: a put fails without creating the object; a get
    /// yields this many bytes and then a retryable error.
    FailAfterBytes(usize),
    /// A get returns the real data with one bit flipped at `byte % len` (silent corruption);
    /// on other operations it behaves like a pass-through.
    FlipBit {
        /// Byte offset (modulo the returned length) whose lowest bit is flipped.
        byte: usize,
    },
}

/// When a rule fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Trigger {
    Next(u64),
    Always,
    Probability(f64),
}

/// One programmable fault: where it applies, when it fires, what it does.
#[derive(Debug, Clone)]
pub struct FaultRule {
    pub(crate) fault: Fault,
    ops: Option<Vec<Op>>,
    path_contains: Option<String>,
    pub(crate) trigger: Trigger,
}

impl FaultRule {
    /// A rule that fires on every call (narrow it with [`ops`](Self::ops), [`times`](Self::times),
    /// [`probability`](Self::probability), [`path_contains`](Self::path_contains)).
    pub fn new(fault: Fault) -> Self {
        Self {
            fault,
            ops: None,
            path_contains: None,
            trigger: Trigger::Always,
        }
    }

    /// Only calls of these operations match.
    pub fn ops(mut self, ops: &[Op]) -> Self {
        self.ops = Some(ops.to_vec());
        self
    }

    /// Only calls whose path (or list prefix) contains `needle` match.
    pub fn path_contains(mut self, needle: &str) -> Self {
        self.path_contains = Some(needle.to_string());
        self
    }

    /// Fire on the next `n` matching calls, then never again.
    pub fn times(mut self, n: u64) -> Self {
        self.trigger = Trigger::Next(n);
        self
    }

    /// Fire on each matching call with probability `p` (clamped to 0..=1), drawn from the store's
    /// seeded RNG so a run is reproducible.
    pub fn probability(mut self, p: f64) -> Self {
        self.trigger = Trigger::Probability(p.clamp(0.0, 1.0));
        self
    }

    pub(crate) fn matches(&self, op: Op, path: &str) -> bool {
        self.ops.as_ref().is_none_or(|ops| ops.contains(&op))
            && self
                .path_contains
                .as_ref()
                .is_none_or(|needle| path.contains(needle.as_str()))
    }
}

/// The payload of every injected error, reachable through the error's source chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("injected {fault:?} fault: op={op:?} path=`{path}`")]
pub struct InjectedFault {
    /// The operation that was hit.
    pub op: Op,
    /// The path (or list prefix) of the call.
    pub path: String,
    /// The fault that fired.
    pub fault: Fault,
}

/// True when `err` was produced by a [`FaultyStore`](crate::FaultyStore).
pub fn is_injected(err: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(e) = source {
        if e.is::<InjectedFault>() {
            return true;
        }
        // `io::Error::source` skips the custom payload itself; look at it explicitly.
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<InjectedFault>())
            {
                return true;
            }
        }
        source = e.source();
    }
    false
}

pub(crate) fn injected_error(op: Op, path: &str, fault: Fault) -> object_store::Error {
    let kind = match fault {
        Fault::Permanent => std::io::ErrorKind::PermissionDenied,
        _ => std::io::ErrorKind::ConnectionReset,
    };
    let payload = InjectedFault {
        op,
        path: path.to_string(),
        fault,
    };
    object_store::Error::Generic {
        store: STORE_NAME,
        source: Box::new(std::io::Error::new(kind, payload)),
    }
}
