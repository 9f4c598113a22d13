//! The keyed entries a simulator writes out to a file on every change
//! (its `/etc/hosts` block, its Prometheus targets), by pod UID, behind a
//! lock. A poisoned lock reads as "nothing to change".

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Entries by key (a pod's UID).
pub struct Entries<V>(Mutex<BTreeMap<String, V>>);

impl<V> Default for Entries<V> {
    fn default() -> Self {
        Entries(Mutex::new(BTreeMap::new()))
    }
}

impl<V: Clone> Entries<V> {
    /// Set the entry under `key`.
    pub fn insert(&self, key: &str, value: V) {
        if let Ok(mut e) = self.0.lock() {
            e.insert(key.to_string(), value);
        }
    }

    /// Remove the entry under `key`; whether there was one.
    pub fn remove(&self, key: &str) -> bool {
        self.0
            .lock()
            .map(|mut e| e.remove(key).is_some())
            .unwrap_or(false)
    }

    /// Remove every entry.
    pub fn clear(&self) {
        if let Ok(mut e) = self.0.lock() {
            e.clear();
        }
    }

    /// Every entry, in key order (`None`: the lock is poisoned).
    pub fn values(&self) -> Option<Vec<V>> {
        self.0.lock().ok().map(|e| e.values().cloned().collect())
    }

    /// Run `write` on every entry (in key order) while holding the lock, so
    /// that writers of the same entries run one at a time and each writes
    /// what it saw last: a snapshot taken before the lock could be written
    /// after a newer one and undo an insert or a removal made in between
    /// (pods starting on several nodes at once each write the file).
    /// `None`: the lock is poisoned.
    pub fn write_out<R>(&self, write: impl FnOnce(&[V]) -> R) -> Option<R> {
        let e = self.0.lock().ok()?;
        let all: Vec<V> = e.values().cloned().collect();
        Some(write(&all))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_clear() {
        let e = Entries::default();
        e.insert("b", 2);
        e.insert("a", 1);
        assert_eq!(e.values(), Some(vec![1, 2]));
        assert!(e.remove("a"));
        assert!(!e.remove("a"));
        e.clear();
        assert_eq!(e.values(), Some(vec![]));
    }
}
