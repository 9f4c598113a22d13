//! The c10d shim on its own: two ranks (threads of this process, real
//! TCPStore + ProcessGroupGloo on loopback) run every collective; a dead
//! peer turns into an error, not a hang.

mod common;

use std::time::{Duration, Instant};

use heterotrain_trainer::c10d::{ProcessGroup, RendezvousConfig};
use tch::Tensor;

fn cfg(rank: usize, port: u16, coll_secs: u64) -> RendezvousConfig {
    RendezvousConfig {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank,
        world_size: 2,
        rendezvous_timeout: Duration::from_secs(20),
        collective_timeout: Duration::from_secs(coll_secs),
        bind_host: None,
        iface: None,
    }
}

/// (all-reduce, broadcast, all-gather, async all-reduce tail) seen by a rank.
type Seen = (Vec<f32>, Vec<i64>, Vec<Vec<i64>>, Vec<f32>);

#[test]
fn two_ranks_run_every_collective() {
    let port = common::free_port();
    let results: Vec<Seen> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let pg = ProcessGroup::join(&cfg(rank, port, 20)).expect("join");
                    let mut t = Tensor::from_slice(&[rank as f32 + 1.0; 4]);
                    pg.all_reduce_sum(&mut t).unwrap();
                    let mut b = Tensor::from_slice(&[rank as i64 * 10 + 7, 3]);
                    pg.broadcast(&mut b, 1).unwrap();
                    let g = pg
                        .all_gather(&Tensor::from_slice(&[rank as i64, 5]))
                        .unwrap();
                    pg.barrier().unwrap();
                    let mut big = Tensor::ones([1000], tch::kind::FLOAT_CPU) * (rank as f64 + 0.5);
                    let w = pg.all_reduce_sum_async(&mut big).unwrap();
                    w.wait().unwrap();
                    (
                        Vec::<f32>::try_from(&t).unwrap(),
                        Vec::<i64>::try_from(&b).unwrap(),
                        g.iter().map(|x| Vec::<i64>::try_from(x).unwrap()).collect(),
                        Vec::<f32>::try_from(&big.narrow(0, 998, 2)).unwrap(),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (all, bc, gathered, big) in results {
        assert_eq!(all, vec![3.0; 4]);
        assert_eq!(bc, vec![17, 3]);
        assert_eq!(gathered, vec![vec![0, 5], vec![1, 5]]);
        assert_eq!(big, vec![2.0, 2.0]);
    }
}

#[test]
fn dead_peer_is_an_error_within_the_collective_timeout() {
    let port = common::free_port();
    std::thread::scope(|s| {
        let peer = s.spawn(move || {
            let pg = ProcessGroup::join(&cfg(1, port, 3)).expect("join");
            drop(pg); // leaves without taking part
        });
        let pg = ProcessGroup::join(&cfg(0, port, 3)).expect("join");
        peer.join().unwrap();
        let start = Instant::now();
        let mut t = Tensor::ones([8], tch::kind::FLOAT_CPU);
        let err = pg.all_reduce_sum(&mut t).expect_err("peer is gone");
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{:?}",
            start.elapsed()
        );
        assert!(
            err.to_string().starts_with("collective all_reduce failed"),
            "{err}"
        );
    });
}
