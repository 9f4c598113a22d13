//! The c10d shim on its own: two ranks (threads of this process, real
//! TCPStore + ProcessGroupGloo on loopback) run every collective; a dead
//! peer turns into an error, not a hang.

mod common;

use std::time::{Duration, Instant};

use heterotrain_trainer::c10d::{ProcessGroup, RendezvousConfig};
use tch::Tensor;

fn cfg(rank: usize, port: u16, coll_secs: u64) -> RendezvousConfig {
    cfg_of(rank, 2, port, coll_secs)
}

/// Ranks join within a minute (threads of one process: at once, unless the
/// machine is loaded).
fn cfg_of(rank: usize, world_size: usize, port: u16, coll_secs: u64) -> RendezvousConfig {
    RendezvousConfig {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank,
        world_size,
        rendezvous_timeout: Duration::from_secs(60),
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

/// The control word's star sum (every rank to rank 0 and back): three
/// ranks, two sums in flight at once and waited in the opposite order;
/// every rank gets the same bits, rank 0's value plus the others' in rank
/// order.
#[test]
fn three_ranks_star_sum_two_words_in_flight() {
    let port = common::free_port();
    let own = |rank: usize| [rank as f64 + 1.0, 0.1 * (rank as f64 + 1.0), -(rank as f64)];
    let results: Vec<(Vec<f64>, Vec<f64>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|rank| {
                s.spawn(move || {
                    let pg = ProcessGroup::join(&cfg_of(rank, 3, port, 20)).expect("join");
                    let mut first = Tensor::from_slice(&own(rank));
                    let mut second = Tensor::from_slice(&[10.0 * rank as f64 + 1.0]);
                    let w1 = pg.star_sum_async(&mut first).unwrap();
                    let w2 = pg.star_sum_async(&mut second).unwrap();
                    w2.wait().unwrap();
                    w1.wait().unwrap();
                    (
                        Vec::<f64>::try_from(&first).unwrap(),
                        Vec::<f64>::try_from(&second).unwrap(),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want: Vec<f64> = (0..3).map(|i| own(0)[i] + own(1)[i] + own(2)[i]).collect();
    for (rank, (first, second)) in results.iter().enumerate() {
        assert_eq!(first, &want, "rank {rank}");
        assert_eq!(second, &vec![1.0 + 11.0 + 21.0], "rank {rank}");
    }
}

/// PyTorch's flight recorder is off in the trainer's processes (its
/// first record of each process group races with the other threads'),
/// unless TORCH_FR_BUFFER_SIZE was set before the process started.
#[test]
fn the_flight_recorder_is_off_unless_asked_for() {
    assert_eq!(
        std::env::var("TORCH_FR_BUFFER_SIZE").as_deref(),
        Ok("0"),
        "the shim's initializer sets it before main"
    );
}

/// How long a collective whose peer is gone may take to fail, given a
/// collective timeout of 3 s: slack for a loaded machine, yet far below
/// what an ignored timeout would give (Gloo's default, 30 minutes; the
/// trainer's, 300 s).
const FAIL_WITHIN: Duration = Duration::from_secs(30);

/// Rank `survivor` of two runs `op` after its peer joined and left
/// without taking part: the error and how long it took.
fn after_the_peer_left(
    survivor: usize,
    op: impl Fn(&ProcessGroup) -> heterotrain_trainer::error::Result<()>,
) -> (String, Duration) {
    let port = common::free_port();
    std::thread::scope(|s| {
        let peer = s.spawn(move || {
            let pg = ProcessGroup::join(&cfg(1 - survivor, port, 3)).expect("join");
            drop(pg); // leaves without taking part
        });
        let pg = ProcessGroup::join(&cfg(survivor, port, 3)).expect("join");
        peer.join().unwrap();
        let start = Instant::now();
        let err = op(&pg).expect_err("peer is gone");
        (err.to_string(), start.elapsed())
    })
}

#[test]
fn dead_peer_is_an_error_within_the_collective_timeout() {
    let (err, took) = after_the_peer_left(0, |pg| {
        let mut t = Tensor::ones([8], tch::kind::FLOAT_CPU);
        pg.all_reduce_sum(&mut t)
    });
    assert!(took < FAIL_WITHIN, "{took:?}");
    assert!(err.starts_with("collective all_reduce failed"), "{err}");
}

/// A star sum whose peer left fails on either side (rank 0 waiting for
/// the peer's word, the peer waiting for rank 0's reply) within the
/// collective timeout.
#[test]
fn a_star_sum_with_a_dead_peer_fails_within_the_timeout() {
    for survivor in [0, 1] {
        let (err, took) = after_the_peer_left(survivor, |pg| {
            let mut t = Tensor::ones([4], tch::kind::DOUBLE_CPU);
            pg.star_sum_async(&mut t).and_then(|w| w.wait())
        });
        assert!(took < FAIL_WITHIN, "rank {survivor}: {took:?}");
        assert!(
            err.starts_with("collective star_sum failed"),
            "rank {survivor}: {err}"
        );
    }
}

/// Under a sharded layout the Reducer sums each gradient element only for
/// its owner: the flat buffer holds b (3 elements) then a (4), rank 0 owns
/// flat elements [0, 5) (b and a cut after its second element), rank 1
/// [5, 7). Each owner holds the exact sum of its elements and its own
/// local gradient elsewhere; without shards every rank holds the whole
/// sum.
#[test]
fn sharded_buckets_are_summed_for_their_owners_only() {
    use heterotrain_trainer::shard::FlatParams;
    let port = common::free_port();
    // Per rank: (sharded step's gradient, replicated step's gradient).
    let results: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let pg = ProcessGroup::join(&cfg(rank, port, 20)).expect("join");
                    let a = Tensor::zeros([2, 2], tch::kind::FLOAT_CPU).set_requires_grad(true);
                    let b = Tensor::zeros([3], tch::kind::FLOAT_CPU).set_requires_grad(true);
                    let params = [a.shallow_clone(), b.shallow_clone()];
                    let flat = FlatParams::new(&params).expect("flat");
                    let reducer = pg.reducer(&params, 1 << 20, 1 << 20).expect("reducer");
                    // d loss / d element i = (rank + 1) · (i + 1).
                    let coeff =
                        Tensor::arange_start(1, 8, tch::kind::FLOAT_CPU) * (rank as f64 + 1.0);
                    let step = |shards: Option<&[(i64, i64)]>| {
                        let whole = flat.range((0, flat.len()));
                        reducer
                            .set_shards(shards.map(|b| (&whole, b)))
                            .expect("set shards");
                        for p in &params {
                            let mut g = p.grad();
                            if g.defined() {
                                let _ = g.zero_();
                            }
                        }
                        reducer.prepare_forward().expect("forward");
                        let x = Tensor::cat(&[a.reshape([-1]), b.reshape([-1])], 0);
                        let loss = (x * &coeff).sum(tch::Kind::Float);
                        reducer.prepare_backward(&loss).expect("arm");
                        loss.backward();
                        let g: Vec<f32> = params
                            .iter()
                            .flat_map(|p| Vec::<f32>::try_from(p.grad().reshape([-1])).unwrap())
                            .collect();
                        g
                    };
                    let sharded = step(Some(&[(0, 5), (5, 7)]));
                    let replicated = step(None);
                    (sharded, replicated)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let local = |rank: usize, i: usize| (rank as f32 + 1.0) * (i as f32 + 1.0);
    let sum = |i: usize| local(0, i) + local(1, i);
    for (rank, (sharded, replicated)) in results.iter().enumerate() {
        let owned = if rank == 0 { 0..5 } else { 5..7 };
        for i in 0..7 {
            // Element i of a then b sits at this flat position.
            let at = if i < 4 { 3 + i } else { i - 4 };
            let want = if owned.contains(&at) {
                sum(i)
            } else {
                local(rank, i)
            };
            assert_eq!(sharded[i], want, "rank {rank}, element {i}, sharded");
            assert_eq!(
                replicated[i],
                sum(i),
                "rank {rank}, element {i}, replicated"
            );
        }
    }
}

/// Addresses of the IPv4 sockets listening on `port` (/proc/net/tcp), and
/// how many IPv6 ones (/proc/net/tcp6: a store on every address is `::`).
fn listeners(port: u16) -> (Vec<String>, usize) {
    let v6 = std::fs::read_to_string("/proc/net/tcp6")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(3) == Some(&"0A")
                && f.get(1)
                    .and_then(|a| a.rsplit_once(':'))
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                    == Some(port)
        })
        .count();
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let v4 = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // local_address is hex "AABBCCDD:PPPP" (address little-endian); state 0A = LISTEN.
            let (addr, p) = f.get(1)?.split_once(':')?;
            (f.get(3) == Some(&"0A") && u16::from_str_radix(p, 16).ok()? == port).then(|| {
                let a = u32::from_str_radix(addr, 16).unwrap_or(0).to_le_bytes();
                format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
            })
        })
        .collect::<Vec<_>>();
    (v4, v6)
}

/// Every listening TCP socket this process holds: (socket inode, address;
/// IPv4 as a dotted quad, IPv6 as "v6:" and the kernel's hex), from its
/// file descriptors' socket inodes and /proc/net/tcp{,6}.
fn own_listeners() -> Vec<(String, String)> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let s = l.to_string_lossy().into_owned();
                    Some(s.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for l in text.lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (Some(local), Some(&"0A"), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            if !inodes.contains(*inode) {
                continue;
            }
            let Some((addr, _)) = local.split_once(':') else {
                continue;
            };
            out.push((
                inode.to_string(),
                if v6 {
                    format!("v6:{addr}")
                } else {
                    let a = u32::from_str_radix(addr, 16).unwrap_or(0).to_le_bytes();
                    format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
                },
            ));
        }
    }
    out
}

#[test]
fn the_store_listens_on_the_bind_address_only() {
    // In a process of its own: other tests' sockets would count among
    // this process's listeners.
    const CHILD: &str = "HT_LISTENERS_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let name = "the_store_listens_on_the_bind_address_only";
        let o = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([name, "--exact", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .expect("run the test in a child");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.status.success(), "{text}");
        assert!(text.contains("1 passed"), "the child ran no test: {text}");
        return;
    }
    // Rank 0 binds 127.4.0.2 (a pod IP): its TCPStore listens there and on
    // no other address, and rank 1 joins through it; Gloo's listeners too.
    // Listeners this process inherited (the parent's, from other tests:
    // Gloo's sockets are not close-on-exec) are not this test's.
    let inherited: std::collections::HashSet<String> = own_listeners()
        .into_iter()
        .map(|(inode, _)| inode)
        .collect();
    let inherited = &inherited;
    let port = common::free_port();
    let ip = "127.4.0.2";
    // Per rank: the store's listeners on its port (IPv4 addresses, IPv6
    // count), and the addresses of every listener this test opened.
    type Seen = ((Vec<String>, usize), Vec<String>);
    let seen: Vec<Seen> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let c = RendezvousConfig {
                        master_addr: ip.into(),
                        bind_host: Some(if rank == 0 { ip } else { "127.4.0.3" }.into()),
                        ..cfg(rank, port, 20)
                    };
                    let pg = ProcessGroup::join(&c).expect("join");
                    let l = listeners(port);
                    pg.barrier().unwrap();
                    // Every socket Gloo and the store listen on, both
                    // ranks' (one process): on the two bind addresses only.
                    let all: Vec<String> = own_listeners()
                        .into_iter()
                        .filter(|(inode, _)| !inherited.contains(inode))
                        .map(|(_, addr)| addr)
                        .collect();
                    pg.barrier().unwrap();
                    (l, all)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        seen[0].0,
        (vec![ip.to_string()], 0),
        "listeners on port {port}"
    );
    for (rank, (_, all)) in seen.iter().enumerate() {
        assert!(!all.is_empty(), "rank {rank}: no listener found at all");
        assert!(
            all.iter().all(|a| a == ip || a == "127.4.0.3"),
            "rank {rank}: listeners {all:?}"
        );
    }
}
