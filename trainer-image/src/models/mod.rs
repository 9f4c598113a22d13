//! Model builders: functions over `nn::Path` whose sub-path names are the
//! stable checkpoint keys (`fc1.weight`, `layer1.0.conv1.weight`, `h.0.attn.c_attn.weight`).

pub mod bn;
pub mod cnn;
pub mod gpt;
pub mod mlp;
pub mod resnet;
pub mod script;

use tch::nn::{self, ModuleT};
use tch::{Kind, Tensor};

use crate::c10d::GroupSlot;
use crate::cli::{BatchNormMode, ModelArgs, ModelName};
use crate::data::DataShape;
use crate::error::{Result, TrainerError};

/// A network: one of the built-ins, or a TorchScript module.
pub enum Net {
    Native(Box<dyn ModuleT>),
    Scripted(script::Scripted),
}

/// A model: the network and how its output is scored.
pub struct Model {
    pub net: Net,
    pub shape: DataShape,
}

impl Model {
    /// Logits for the batch `x` (fails only for a TorchScript module that
    /// cannot take `x`).
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        match &self.net {
            Net::Native(n) => Ok(n.forward_t(x, train)),
            Net::Scripted(s) => s.forward(x, train),
        }
    }

    /// The TorchScript module, for `--model torchscript`.
    pub fn scripted(&self) -> Option<&script::Scripted> {
        match &self.net {
            Net::Scripted(s) => Some(s),
            Net::Native(_) => None,
        }
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
    let net: Box<dyn ModuleT> = match (cfg.arch, shape, shape.as_image()) {
        (ModelName::Torchscript, _, _) => {
            let (sample, classes) = shape
                .sample_and_classes()
                .ok_or_else(|| mismatch("torchscript (needs class labels)"))?;
            let file = cfg.model_file.as_ref().ok_or_else(|| {
                TrainerError::Config("--model torchscript needs --model-file".into())
            })?;
            let s = script::Scripted::load(p, file)?;
            s.check_output(&sample, classes, p.device())?;
            return Ok(Model {
                net: Net::Scripted(s),
                shape: shape.clone(),
            });
        }
        (ModelName::Mlp, _, _) => {
            let (sample, classes) = shape
                .sample_and_classes()
                .ok_or_else(|| mismatch("mlp (needs class labels)"))?;
            Box::new(mlp::mlp(p, sample.iter().product(), cfg.hidden, classes))
        }
        (ModelName::SimpleCnn, _, Some((chw, classes))) => {
            // Two 2×2 poolings: a smaller image leaves nothing to classify.
            if chw[1] < 4 || chw[2] < 4 {
                return Err(mismatch("simple_cnn (needs images of at least 4×4 pixels)"));
            }
            Box::new(cnn::simple_cnn(p, chw, cfg.hidden, classes))
        }
        (ModelName::Resnet18 | ModelName::Resnet50, _, Some((chw, classes))) => {
            if chw[0] != 3 {
                return Err(mismatch(&format!(
                    "{} (needs 3 channels)",
                    cfg.arch.as_str()
                )));
            }
            let depth = if cfg.arch == ModelName::Resnet18 {
                resnet::Depth::R18
            } else {
                resnet::Depth::R50
            };
            Box::new(resnet::resnet(p, depth, cfg.resnet_width, classes, sync))
        }
        (ModelName::Gpt, DataShape::Text { context, vocab }, _) => Box::new(gpt::gpt(
            p,
            gpt::GptConfig {
                vocab: *vocab,
                context: *context,
                layers: cfg.layers,
                heads: cfg.heads,
                width: cfg.hidden,
            },
        )),
        (m, _, _) => return Err(mismatch(m.as_str())),
    };
    Ok(Model {
        net: Net::Native(net),
        shape: shape.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_cnn_refuses_images_too_small_for_its_poolings() {
        let args = crate::cli::train_args(&["--model", "simple_cnn"]);
        let shape = |h: i64, w: i64| DataShape::Image {
            chw: [1, h, w],
            classes: 10,
        };
        let build_at = |h, w| {
            let vs = nn::VarStore::new(tch::Device::Cpu);
            build(&vs.root(), &args.model, &shape(h, w), &GroupSlot::default()).map(|_| ())
        };
        let e = build_at(3, 8).expect_err("3 rows is too few");
        assert!(e.to_string().contains("at least 4×4 pixels"), "{e}");
        assert!(build_at(8, 2).is_err());
        assert!(build_at(4, 4).is_ok());
    }
}
