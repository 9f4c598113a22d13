use super::*;

#[test]
fn draws_a_line_chart_png() {
    if init_font().is_err() {
        eprintln!("skipping: no font on this machine");
        return;
    }
    let dir = std::env::temp_dir().join(format!("ht-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("x.png");
    line_chart(
        &p,
        &LineChart {
            title: "t".into(),
            x_label: "s",
            y_label: "y",
            series: vec![("a".into(), vec![(0.0, 1.0), (1.0, 2.0)])],
            hlines: vec![("ideal".into(), 2.5)],
            shade: Some((0.2, 0.4)),
            staircase: true,
        },
    )
    .unwrap();
    let bytes = std::fs::read(&p).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    let empty = line_chart(
        &dir.join("y.png"),
        &LineChart {
            title: "t".into(),
            x_label: "s",
            y_label: "y",
            series: vec![("a".into(), vec![])],
            hlines: vec![],
            shade: None,
            staircase: false,
        },
    );
    assert!(
        empty.is_err(),
        "an empty chart is an error, not a blank image"
    );
    let bars = dir.join("z.png");
    stacked_bars(
        &bars,
        &StackedBars {
            title: "t".into(),
            y_label: "ms",
            parts: vec!["a".into(), "b".into()],
            bars: vec![("r0".into(), vec![1.0, 2.0]), ("r1".into(), vec![3.0, 0.5])],
        },
    )
    .unwrap();
    assert_eq!(&std::fs::read(&bars).unwrap()[1..4], b"PNG");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn staircase_holds_each_value_until_the_next_point() {
    assert_eq!(
        staircase(&[(0.0, 64.0), (1.0, 80.0), (3.0, 96.0)]),
        vec![
            (0.0, 64.0),
            (1.0, 64.0),
            (1.0, 80.0),
            (3.0, 80.0),
            (3.0, 96.0)
        ]
    );
    assert!(staircase(&[]).is_empty());
}
