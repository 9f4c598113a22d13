use super::*;

const TEXT: &str = r#"# HELP heterotrain_steps Optimizer steps taken.
# TYPE heterotrain_steps counter
heterotrain_steps_total 12
# TYPE heterotrain_compute_seconds counter
heterotrain_compute_seconds_total 3.5
# TYPE heterotrain_local_batch_size gauge
heterotrain_local_batch_size 16
heterotrain_compute_spread_seconds 0.012
heterotrain_step 12
heterotrain_epoch 1
heterotrain_plan_generation 2
heterotrain_profile_step_seconds{batch_size="16"} 0.2
heterotrain_profile_step_seconds{batch_size="8"} 0.1
heterotrain_profile_max_batch_size 512
heterotrain_step_seconds_bucket{le="0.1"} 3
heterotrain_finished 0
# EOF
"#;

#[test]
fn parses_trainer_exposition() {
    let s = parse_exposition(TEXT).expect("parse");
    let r = RankMetrics::from_series(&s);
    assert_eq!(r.steps_total, Some(12.0));
    assert_eq!(r.compute_seconds_total, Some(3.5));
    assert_eq!(r.local_batch, Some(16));
    assert_eq!(r.compute_spread_seconds, Some(0.012));
    assert_eq!(r.step, Some(12));
    assert_eq!(r.epoch, Some(1));
    assert_eq!(r.plan_generation, Some(2));
    assert!(!r.finished);
    let p = r.profile.expect("profile");
    assert_eq!(p.points, vec![(8, 0.1), (16, 0.2)]);
    assert_eq!(p.max_batch, 512);
}

#[test]
fn a_profile_with_too_many_points_is_dropped_not_fitted() {
    let text = |n: u32| {
        let mut t = String::from("heterotrain_profile_max_batch_size 4096\n");
        for b in 1..=n {
            t.push_str(&format!(
                "heterotrain_profile_step_seconds{{batch_size=\"{b}\"}} {}\n",
                0.01 + 0.001 * f64::from(b)
            ));
        }
        RankMetrics::from_series(&parse_exposition(&t).unwrap())
    };
    let limit = MAX_PROFILE_POINTS as u32;
    let ok = text(limit);
    assert_eq!(
        ok.profile.expect("profile").points.len(),
        MAX_PROFILE_POINTS
    );
    assert_eq!(ok.profile_points_dropped, None);
    let over = text(limit + 1);
    assert_eq!(over.profile, None);
    assert_eq!(over.profile_points_dropped, Some(MAX_PROFILE_POINTS + 1));
    // A batch size exported twice counts once (the first value).
    let twice = "heterotrain_profile_max_batch_size 64\n\
        heterotrain_profile_step_seconds{batch_size=\"8\"} 0.1\n\
        heterotrain_profile_step_seconds{batch_size=\"8\", x=\"y\"} 0.3\n";
    let p = RankMetrics::from_series(&parse_exposition(twice).unwrap()).profile;
    assert_eq!(p.expect("profile").points, vec![(8, 0.1)]);
}

#[test]
fn link_figures_take_the_slowest_peer_else_the_bus_bandwidth() {
    let text = "heterotrain_profile_allreduce_latency_seconds 0.0002\n\
        heterotrain_profile_allreduce_bus_bandwidth_bytes_per_second 3e9\n\
        heterotrain_profile_link_bandwidth_bytes_per_second{peer=\"0\"} 2e9\n\
        heterotrain_profile_link_bandwidth_bytes_per_second{peer=\"2\"} 5e8\n\
        heterotrain_gradient_bytes 1600000\n";
    let l = RankMetrics::from_series(&parse_exposition(text).unwrap())
        .link
        .expect("link");
    assert_eq!(l.latency_seconds, 0.0002);
    assert_eq!(l.bandwidth_bytes_per_second, 5e8);
    assert_eq!(l.gradient_bytes, Some(1_600_000));
    // No rank-to-rank gauges: the bus bandwidth.
    let bus_only = text
        .lines()
        .filter(|l| !l.contains("link_"))
        .collect::<Vec<_>>()
        .join("\n");
    let l = RankMetrics::from_series(&parse_exposition(&bus_only).unwrap())
        .link
        .expect("link");
    assert_eq!(l.bandwidth_bytes_per_second, 3e9);
    // Not measured (a single rank exports 0): none.
    let alone = "heterotrain_profile_allreduce_latency_seconds 0\n\
        heterotrain_profile_allreduce_bus_bandwidth_bytes_per_second 0\n";
    assert_eq!(
        RankMetrics::from_series(&parse_exposition(alone).unwrap()).link,
        None
    );
}

#[test]
fn quota_use_counts_only_under_a_quota() {
    let read =
        |text: &str| RankMetrics::from_series(&parse_exposition(text).unwrap()).cpu_quota_used;
    assert_eq!(
        read("heterotrain_cpu_quota_cores 0.15\nheterotrain_cpu_quota_used_ratio 0.97\n"),
        Some(0.97)
    );
    // No quota (0 cores), not measured yet (0), or absent: none.
    assert_eq!(
        read("heterotrain_cpu_quota_cores 0\nheterotrain_cpu_quota_used_ratio 0.97\n"),
        None
    );
    assert_eq!(
        read("heterotrain_cpu_quota_cores 0.15\nheterotrain_cpu_quota_used_ratio 0\n"),
        None
    );
    assert_eq!(read("heterotrain_cpu_quota_used_ratio 0.5\n"), None);
}

#[test]
fn garbage_gives_empty_metrics() {
    let s = parse_exposition("this is not metrics\n{{{").unwrap_or_default();
    assert_eq!(RankMetrics::from_series(&s), RankMetrics::default());
}

#[test]
fn prometheus_answers_group_by_pod() {
    let body = r#"{"status":"success","data":{"resultType":"vector","result":[
          {"metric":{"__name__":"heterotrain_local_batch_size","pod":"j-1","namespace":"n"},"value":[1,"24"]},
          {"metric":{"__name__":"heterotrain_local_batch_size","pod":"j-0","namespace":"n"},"value":[1,"8"]},
          {"metric":{"__name__":"heterotrain_local_batch_size","pod":"other-0"},"value":[1,"99"]}]}}"#;
    let s = parse_prometheus_vector(body).expect("parse");
    let ranks = group_by_rank(&s, "j", 3);
    assert_eq!(ranks[0].as_ref().ok().and_then(|r| r.local_batch), Some(8));
    assert_eq!(ranks[1].as_ref().ok().and_then(|r| r.local_batch), Some(24));
    assert!(ranks[2].is_err());
    assert!(parse_prometheus_vector(r#"{"status":"error","error":"bad"}"#).is_err());
    assert_eq!(percent_encode("a b{=\"}"), "a%20b%7B%3D%22%7D");
}

/// `text` fed to [`Lines`] in pieces of `chunk` bytes: the kept text and
/// the most bytes held at once.
fn stream(text: &[u8], chunk: usize) -> (Result<String, String>, usize) {
    let mut lines = super::exposition::Lines::default();
    let mut most = 0;
    for piece in text.chunks(chunk) {
        if let Err(e) = lines.push(piece) {
            return (Err(e), most);
        }
        most = most.max(lines.held());
    }
    (lines.finish(), most)
}

#[test]
fn streamed_bodies_keep_only_the_operators_lines_in_any_pieces() {
    let noisy = format!(
        "# HELP process_cpu_seconds_total CPU.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 4\n{TEXT}go_goroutines 7\n"
    );
    let whole = RankMetrics::from_series(&parse_exposition(&noisy).unwrap());
    assert_eq!(whole.steps_total, Some(12.0), "the reference parse");
    for chunk in [1, 2, 3, 7, 64, 4096] {
        let (kept, _) = stream(noisy.as_bytes(), chunk);
        let kept = kept.expect("streamed");
        assert!(
            !kept.contains("process_") && !kept.contains("go_"),
            "{kept}"
        );
        // The same metrics as from the whole body, the counters' types kept.
        assert_eq!(
            RankMetrics::from_series(&parse_exposition(&kept).unwrap()),
            whole,
            "chunk {chunk}"
        );
    }
    // No final newline: the last line still counts.
    let (kept, _) = stream(b"heterotrain_step 5", 3);
    assert_eq!(kept.unwrap(), "heterotrain_step 5\n");
}

#[test]
fn a_large_body_is_read_holding_only_the_wanted_lines() {
    // 3 MiB of other series and one 1 MiB line, around the trainer's lines.
    let mut body = Vec::new();
    for i in 0..50_000 {
        body.extend_from_slice(
            format!("other_series{{i=\"{i}\",pad=\"{:040}\"}} 1\n", 0).as_bytes(),
        );
    }
    body.extend_from_slice(b"# HELP huge ");
    body.extend(std::iter::repeat_n(b'x', 1 << 20));
    body.push(b'\n');
    body.extend_from_slice(TEXT.as_bytes());
    assert!(body.len() > 4 << 20, "{} bytes", body.len());
    let (kept, most) = stream(&body, 16 << 10);
    let kept = kept.expect("streamed");
    assert_eq!(
        RankMetrics::from_series(&parse_exposition(&kept).unwrap()).step,
        Some(12)
    );
    // At most one line's limit in flight plus the piece being split, never the body.
    assert!(
        most < 2 * super::exposition::MAX_LINE_BYTES + (32 << 10),
        "held {most} bytes"
    );
    // A trainer line past the limit fails the scrape rather than grow.
    let mut long = b"heterotrain_step{x=\"".to_vec();
    long.extend(std::iter::repeat_n(b'y', super::exposition::MAX_LINE_BYTES));
    let (err, _) = stream(&long, 4096);
    assert!(err.unwrap_err().contains("longer than"));
}
