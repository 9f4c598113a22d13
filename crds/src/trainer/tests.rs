use super::*;
use crate::{Backend, BatchNormMode, DatasetName, Device, ModelName, Optimizer, Schedule};

fn parse(args: &[String]) -> TrainerArgs {
    TrainerArgs::parse_flags(args).expect("the trainer parses what to_args wrote")
}

#[test]
fn defaults_write_no_switches_and_parse_back_to_themselves() {
    let d = TrainerArgs::defaults().expect("defaults");
    let args = d.to_args().expect("args");
    assert!(!args
        .iter()
        .any(|a| a == "--no-shuffle" || a == "--no-profile"));
    assert!(!args.iter().any(|a| a == "--rank" || a == "--job-uid"));
    // Test knobs stay off the command line, so that a group's `env` (e.g.
    // HT_STEP_SLEEP_MS) reaches the trainer: a flag beats its variable.
    for knob in [
        "--step-sleep-ms",
        "--prefetch-wait",
        "--first-plan-wait-secs",
    ] {
        assert!(!args.iter().any(|a| a == knob), "{knob} in {args:?}");
    }
    assert_eq!(parse(&args), d);
}

#[test]
fn every_written_setting_parses_back() {
    let mut a = TrainerArgs::defaults().expect("defaults");
    a.model.arch = ModelName::Resnet18;
    a.model.batch_norm = BatchNormMode::Local;
    a.model.resnet_width = 8;
    a.model.model_file = Some("/data/model.pt".into());
    a.data.dataset = DatasetName::Cifar100;
    a.data.data_dir = Some("/data/x y".into());
    a.data.no_shuffle = true;
    a.data.eval_fraction = 0.125;
    a.optim.batch_size = 96;
    a.optim.max_steps = Some(7);
    a.optim.lr = 1e-5;
    a.optim.optimizer = Optimizer::Adamw;
    a.optim.schedule = Schedule::Cosine;
    a.optim.optimizer_sharding = crate::OptimizerSharding::Replicated;
    a.optim.deterministic = true;
    a.dist.backend = Backend::Nccl;
    a.dist.device = Device::Cuda;
    a.dist.threads = 3;
    a.output.checkpoint_dir = Some("/ckpt".into());
    a.output.resume = ResumeMode::Auto;
    a.plan.balancer = BalancerMode::Local;
    a.plan.policy = "hybrid".into();
    a.obs.profile_batch_sizes = vec![4, 12];
    a.obs.no_profile = true;
    a.obs.step_sleep_ms = 5;
    let args = a.to_args().expect("args");
    assert_eq!(parse(&args), a, "{args:?}");
    let at = |flag: &str| {
        args.iter()
            .position(|x| x == flag)
            .map(|i| args[i + 1].as_str())
    };
    assert_eq!(at("--model"), Some("resnet18"));
    assert_eq!(at("--dataset"), Some("cifar100"));
    assert_eq!(at("--model-file"), Some("/data/model.pt"));
    assert_eq!(at("--profile-batch-sizes"), Some("4,12"));
}

#[test]
fn launcher_settings_are_never_flags() {
    let mut a = TrainerArgs::defaults().expect("defaults");
    a.dist.rank = 3;
    a.dist.world_size = 4;
    a.dist.master_addr = "elsewhere".into();
    a.output.job_uid = Some("uid".into());
    a.plan.plan_configmap = Some("j-plan".into());
    a.obs.metrics_addr = Some("10.0.0.1".into());
    let args = a.to_args().expect("args");
    let parsed = parse(&args);
    assert_eq!(parsed.dist.rank, 0);
    assert_eq!(parsed.dist.master_addr, "127.0.0.1");
    assert_eq!(parsed.output.job_uid, None);
    assert_eq!(parsed.plan.plan_configmap, None);
}

#[test]
fn min_local_batch_is_two_only_for_local_batch_norm() {
    let mut m = TrainerArgs::defaults().expect("defaults").model;
    assert_eq!(m.min_local_batch(), 1);
    m.arch = ModelName::Resnet18;
    assert_eq!(m.min_local_batch(), 1);
    m.batch_norm = BatchNormMode::Local;
    assert_eq!(m.min_local_batch(), 2);
}
