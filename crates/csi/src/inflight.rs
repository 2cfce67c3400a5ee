//! One operation per volume at a time, as the CSI spec asks of a plugin: a call on a volume
//! (or snapshot) that already has one in progress is answered `ABORTED` at once, and the CO
//! retries it later.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;

/// The names with an operation in progress.
#[derive(Debug, Default, Clone)]
pub struct Inflight {
    names: Arc<Mutex<BTreeSet<String>>>,
}

/// Held while an operation runs; dropping it ends the operation.
#[derive(Debug)]
pub struct Busy {
    names: Arc<Mutex<BTreeSet<String>>>,
    name: String,
}

impl Inflight {
    /// Starts an operation on `name`, or `ABORTED` when one is running.
    pub fn start(&self, name: &str) -> Result<Busy, tonic::Status> {
        if !self.names.lock().insert(name.to_string()) {
            return Err(tonic::Status::aborted(format!(
                "an operation on {name} is already in progress"
            )));
        }
        Ok(Busy {
            names: self.names.clone(),
            name: name.to_string(),
        })
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.names.lock().remove(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_operation_on_a_name_is_aborted_until_the_first_ends() {
        let f = Inflight::default();
        let a = f.start("v").unwrap();
        assert_eq!(f.start("v").unwrap_err().code(), tonic::Code::Aborted);
        let _b = f.start("w").unwrap();
        drop(a);
        assert!(f.start("v").is_ok());
    }
}
