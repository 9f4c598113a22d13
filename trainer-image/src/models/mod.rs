//! Model builders: functions over `nn::Path` whose sub-path names are the
//! stable checkpoint keys (`fc1.weight`, `layer1.0.conv1.weight`, `h.0.attn.c_attn.weight`).

pub mod bn;
pub mod cnn;
pub mod gpt;
pub mod mlp;
pub mod resnet;

use tch::nn::{self, ModuleT};
use tch::{Kind, Tensor};

use crate::c10d::GroupSlot;
use crate::cli::{BatchNormMode, ModelArgs, ModelName};
use crate::data::DataShape;
use crate::error::{Result, TrainerError};

/// A model: the network and how its output is scored.
pub struct Model {
    pub net: Box<dyn ModuleT>,
    pub shape: DataShape,
}

impl Model {
    pub fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        self.net.forward_t(x, train)
    }

    /// Mean cross-entropy over the local batch (over tokens for text).
    pub fn loss(&self, logits: &Tensor, y: &Tensor) -> Tensor {
        let classes = *logits.size().last().unwrap_or(&1);
        logits
            .view([-1, classes])
            .cross_entropy_for_logits(&y.view([-1]))
    }

    /// (number correct, number scored, summed loss) for evaluation.
    pub fn score(&self, logits: &Tensor, y: &Tensor) -> (f64, f64, f64) {
        let classes = *logits.size().last().unwrap_or(&1);
        let l = logits.view([-1, classes]);
        let t = y.view([-1]);
        let correct = l
            .argmax(-1, false)
            .eq_tensor(&t)
            .sum(Kind::Float)
            .double_value(&[]);
        let n = t.size()[0] as f64;
        let loss = l
            .log_softmax(-1, Kind::Float)
            .nll_loss(&t)
            .double_value(&[])
            * n;
        (correct, n, loss)
    }
}

/// Build the model a config names for data of `shape`. BatchNorm layers in
/// `sync` mode reduce their statistics through `group` once it is bound.
pub fn build(p: &nn::Path, cfg: &ModelArgs, shape: &DataShape, group: &GroupSlot) -> Result<Model> {
    let sync = (cfg.batch_norm == BatchNormMode::Sync).then(|| group.clone());
    let mismatch = |m: &str| {
        TrainerError::Config(format!(
            "--model {m} does not fit the dataset's shape {shape:?}"
        ))
    };
    let net: Box<dyn ModuleT> = match (cfg.arch, shape) {
        (ModelName::Mlp, DataShape::Image { chw, classes }) => {
            Box::new(mlp::mlp(p, chw.iter().product(), cfg.hidden, *classes))
        }
        (ModelName::SimpleCnn, DataShape::Image { chw, classes }) => {
            Box::new(cnn::simple_cnn(p, *chw, cfg.hidden, *classes))
        }
        (ModelName::Resnet18, DataShape::Image { chw, classes }) => {
            if chw[0] != 3 {
                return Err(mismatch("resnet18 (needs 3 channels)"));
            }
            Box::new(resnet::resnet(
                p,
                resnet::Depth::R18,
                cfg.resnet_width,
                *classes,
                sync,
            ))
        }
        (ModelName::Resnet50, DataShape::Image { chw, classes }) => {
            if chw[0] != 3 {
                return Err(mismatch("resnet50 (needs 3 channels)"));
            }
            Box::new(resnet::resnet(
                p,
                resnet::Depth::R50,
                cfg.resnet_width,
                *classes,
                sync,
            ))
        }
        (ModelName::Gpt, DataShape::Text { context, vocab }) => Box::new(gpt::gpt(
            p,
            gpt::GptConfig {
                vocab: *vocab,
                context: *context,
                layers: cfg.layers,
                heads: cfg.heads,
                width: cfg.hidden,
            },
        )),
        (m, _) => return Err(mismatch(&format!("{m:?}"))),
    };
    Ok(Model {
        net,
        shape: shape.clone(),
    })
}
