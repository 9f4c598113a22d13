//! Metrics reads off the reconcile path. A balancing round asks for a
//! job's metrics ([`Collector::start`]) and goes on at once; the read runs
//! in its own task (at most one per job, at most [`MAX_READS`] at a time,
//! each bounded in time and size by the [`Scraper`]); when it ends the
//! reading is kept and the job is woken for another reconcile, which takes
//! it ([`Collector::take`]). A slow or huge `/metrics` endpoint therefore
//! never holds a reconcile, nor the controller's reconcile slots.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::channel::mpsc;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Semaphore;

use super::source::Request;
use super::JobKey;
use crate::error::Result;
use crate::scrape::{RankMetrics, Scraper};

/// Reads in flight at once, over all jobs.
pub const MAX_READS: usize = 32;

/// One finished read of a job's ranks.
#[derive(Debug)]
pub struct Reading {
    /// When it finished.
    pub at: Instant,
    /// Each rank's metrics, or why they could not be read, in rank order.
    pub ranks: Vec<Result<RankMetrics>>,
}

#[derive(Default)]
struct Slot {
    /// Which gang the read in flight or the reading is of.
    tag: String,
    in_flight: bool,
    done: Option<Reading>,
}

/// Where to send a job to be reconciled again.
struct Waker {
    namespace: Option<String>,
    resource: ApiResource,
    tx: mpsc::UnboundedSender<ObjectRef<DynamicObject>>,
}

/// The reads of every job, and how to wake a job.
pub struct Collector {
    jobs: Arc<Mutex<HashMap<JobKey, Slot>>>,
    wakers: Arc<Mutex<Vec<Waker>>>,
    permits: Arc<Semaphore>,
}

impl Default for Collector {
    fn default() -> Collector {
        Collector {
            jobs: Arc::default(),
            wakers: Arc::default(),
            permits: Arc::new(Semaphore::new(MAX_READS)),
        }
    }
}

impl Collector {
    /// No reads yet.
    pub fn new() -> Collector {
        Collector::default()
    }

    /// Wake jobs of `namespace` (all when `None`) through `tx` once their
    /// read is done. Returns nothing; replaces an earlier waker of the scope.
    pub fn register(
        &self,
        namespace: Option<String>,
        resource: ApiResource,
        tx: mpsc::UnboundedSender<ObjectRef<DynamicObject>>,
    ) {
        if let Ok(mut w) = self.wakers.lock() {
            w.retain(|x| x.namespace != namespace);
            w.push(Waker {
                namespace,
                resource,
                tx,
            });
        }
    }

    /// Start reading `key`'s metrics with `request` unless a read of it is
    /// in flight; `tag` names the gang (a reading of another gang is never
    /// taken). Returns the read's task when one started.
    pub fn start(
        &self,
        key: &JobKey,
        tag: &str,
        request: Request,
        scraper: &Scraper,
    ) -> Option<tokio::task::JoinHandle<()>> {
        {
            let mut jobs = self.jobs.lock().ok()?;
            let slot = jobs.entry(key.clone()).or_default();
            if slot.in_flight {
                return None;
            }
            if slot.tag != tag {
                slot.done = None;
            }
            slot.tag = tag.to_string();
            slot.in_flight = true;
        }
        let (jobs, wakers, permits) =
            (self.jobs.clone(), self.wakers.clone(), self.permits.clone());
        let (key, tag, scraper) = (key.clone(), tag.to_string(), scraper.clone());
        // However the task ends (a panic, aborted, the runtime stopping),
        // the job's next round may start a read again.
        let release = InFlight {
            jobs: jobs.clone(),
            key: key.clone(),
            tag: tag.clone(),
        };
        Some(tokio::spawn(async move {
            let _release = release;
            let _permit = permits.acquire_owned().await.ok();
            let ranks = request.run(&scraper).await;
            let kept = jobs.lock().ok().is_some_and(|mut jobs| {
                match jobs.get_mut(&key).filter(|s| s.tag == tag) {
                    Some(slot) => {
                        slot.in_flight = false;
                        slot.done = Some(Reading {
                            at: Instant::now(),
                            ranks,
                        });
                        true
                    }
                    // Forgotten (the job or its gang is gone) meanwhile.
                    None => false,
                }
            });
            if kept {
                wake(&wakers, &key);
            }
        }))
    }

    /// The reading of `key`'s gang `tag` finished since the last take.
    pub fn take(&self, key: &JobKey, tag: &str) -> Option<Reading> {
        let mut jobs = self.jobs.lock().ok()?;
        let slot = jobs.get_mut(key).filter(|s| s.tag == tag)?;
        slot.done.take()
    }

    /// Drop `key`'s slot (the job is gone); a read in flight is discarded.
    pub fn forget(&self, key: &JobKey) {
        self.jobs.lock().map(|mut j| j.remove(key)).ok();
    }

    /// Drop every slot and waker (the controllers stopped).
    pub fn clear(&self) {
        self.jobs.lock().map(|mut j| j.clear()).ok();
        self.wakers.lock().map(|mut w| w.clear()).ok();
    }
}

/// Marks a job's read as no longer in flight when dropped.
struct InFlight {
    jobs: Arc<Mutex<HashMap<JobKey, Slot>>>,
    key: JobKey,
    tag: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut jobs) = self.jobs.lock() {
            if let Some(slot) = jobs.get_mut(&self.key).filter(|s| s.tag == self.tag) {
                slot.in_flight = false;
            }
        }
    }
}

/// Ask the controller watching `key`'s namespace to reconcile it.
fn wake(wakers: &Mutex<Vec<Waker>>, key: &JobKey) {
    let Some((ns, name)) = key.parts() else {
        return;
    };
    let Ok(w) = wakers.lock() else {
        return;
    };
    if let Some(w) = w
        .iter()
        .find(|w| w.namespace.as_deref().is_none_or(|n| n == ns))
    {
        let r = ObjectRef::new_with(name, w.resource.clone()).within(ns);
        let _ = w.tx.unbounded_send(r);
    }
}

#[cfg(test)]
mod tests;
