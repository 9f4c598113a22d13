//! ResNet-18 / ResNet-50 (He et al., 2015) with the BatchNorm of
//! [`super::bn`] and a configurable base width (64 is the standard model;
//! a narrower one suits tests and small machines). Variable names follow
//! torchvision's (`conv1`, `bn1`, `layer1.0.conv1`, `layer1.0.downsample.0`,
//! `fc`), so standard checkpoints line up.

use tch::nn::{self, ModuleT};
use tch::Tensor;

use super::bn::{batch_norm2d, HeteroBatchNorm};
use crate::c10d::GroupSlot;

fn conv(p: nn::Path, c_in: i64, c_out: i64, k: i64, stride: i64) -> nn::Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding: k / 2,
        bias: false,
        ..Default::default()
    };
    nn::conv2d(p, c_in, c_out, k, cfg)
}

/// 1×1 convolution + BatchNorm when the shortcut changes shape.
#[derive(Debug)]
struct Shortcut {
    conv: nn::Conv2D,
    bn: HeteroBatchNorm,
}

fn shortcut(
    p: nn::Path,
    c_in: i64,
    c_out: i64,
    stride: i64,
    sync: &Option<GroupSlot>,
) -> Option<Shortcut> {
    (stride != 1 || c_in != c_out).then(|| Shortcut {
        conv: conv(&p / "0", c_in, c_out, 1, stride),
        bn: batch_norm2d(&p / "1", c_out, sync.clone()),
    })
}

/// A residual block: 2 (basic) or 3 (bottleneck) conv+BN stages.
#[derive(Debug)]
struct Block {
    stages: Vec<(nn::Conv2D, HeteroBatchNorm)>,
    shortcut: Option<Shortcut>,
}

impl ModuleT for Block {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut ys = xs.shallow_clone();
        let last = self.stages.len().saturating_sub(1);
        for (i, (c, bn)) in self.stages.iter().enumerate() {
            ys = ys.apply(c).apply_t(bn, train);
            if i < last {
                ys = ys.relu();
            }
        }
        let skip = match &self.shortcut {
            Some(s) => xs.apply(&s.conv).apply_t(&s.bn, train),
            None => xs.shallow_clone(),
        };
        (skip + ys).relu()
    }
}

fn basic(p: nn::Path, c_in: i64, c_out: i64, stride: i64, sync: &Option<GroupSlot>) -> Block {
    Block {
        stages: vec![
            (
                conv(&p / "conv1", c_in, c_out, 3, stride),
                batch_norm2d(&p / "bn1", c_out, sync.clone()),
            ),
            (
                conv(&p / "conv2", c_out, c_out, 3, 1),
                batch_norm2d(&p / "bn2", c_out, sync.clone()),
            ),
        ],
        shortcut: shortcut(&p / "downsample", c_in, c_out, stride, sync),
    }
}

fn bottleneck(p: nn::Path, c_in: i64, width: i64, stride: i64, sync: &Option<GroupSlot>) -> Block {
    let out = 4 * width;
    Block {
        stages: vec![
            (
                conv(&p / "conv1", c_in, width, 1, 1),
                batch_norm2d(&p / "bn1", width, sync.clone()),
            ),
            (
                conv(&p / "conv2", width, width, 3, stride),
                batch_norm2d(&p / "bn2", width, sync.clone()),
            ),
            (
                conv(&p / "conv3", width, out, 1, 1),
                batch_norm2d(&p / "bn3", out, sync.clone()),
            ),
        ],
        shortcut: shortcut(&p / "downsample", c_in, out, stride, sync),
    }
}

/// The whole network.
#[derive(Debug)]
pub struct ResNet {
    stem: nn::Conv2D,
    stem_bn: HeteroBatchNorm,
    blocks: Vec<Block>,
    fc: nn::Linear,
}

impl ModuleT for ResNet {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut ys = xs
            .apply(&self.stem)
            .apply_t(&self.stem_bn, train)
            .relu()
            .max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
        for b in &self.blocks {
            ys = ys.apply_t(b, train);
        }
        ys.adaptive_avg_pool2d([1, 1]).flat_view().apply(&self.fc)
    }
}

/// Which ResNet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// Basic blocks 2-2-2-2.
    R18,
    /// Bottleneck blocks 3-4-6-3.
    R50,
}

/// Build a ResNet over 3-channel images with base width `width`.
pub fn resnet(
    p: &nn::Path,
    depth: Depth,
    width: i64,
    classes: i64,
    sync: Option<GroupSlot>,
) -> ResNet {
    let w = width.max(1);
    let stem = nn::conv2d(
        p / "conv1",
        3,
        w,
        7,
        nn::ConvConfig {
            stride: 2,
            padding: 3,
            bias: false,
            ..Default::default()
        },
    );
    let stem_bn = batch_norm2d(p / "bn1", w, sync.clone());
    let (counts, expansion) = match depth {
        Depth::R18 => ([2, 2, 2, 2], 1),
        Depth::R50 => ([3, 4, 6, 3], 4),
    };
    let mut blocks = Vec::new();
    let mut c_in = w;
    for (li, &n) in counts.iter().enumerate() {
        let width_l = w << li;
        let lp = p / format!("layer{}", li + 1);
        for bi in 0..n {
            let stride = if li > 0 && bi == 0 { 2 } else { 1 };
            let bp = &lp / bi.to_string();
            let block = match depth {
                Depth::R18 => basic(bp, c_in, width_l, stride, &sync),
                Depth::R50 => bottleneck(bp, c_in, width_l, stride, &sync),
            };
            blocks.push(block);
            c_in = width_l * expansion;
        }
    }
    let fc = nn::linear(p / "fc", c_in, classes, Default::default());
    ResNet {
        stem,
        stem_bn,
        blocks,
        fc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::VarStore;
    use tch::Device;

    #[test]
    fn standard_width_has_torchvision_names_and_shapes() {
        let vs = VarStore::new(Device::Cpu);
        let net = resnet(&vs.root(), Depth::R18, 64, 10, None);
        let vars = vs.variables();
        assert_eq!(vars["layer4.1.conv2.weight"].size(), vec![512, 512, 3, 3]);
        assert_eq!(
            vars["layer2.0.downsample.0.weight"].size(),
            vec![128, 64, 1, 1]
        );
        assert!(vars.contains_key("layer3.0.downsample.1.running_var"));
        assert!(!vars.contains_key("layer1.0.downsample.0.weight"));
        assert_eq!(vars["fc.weight"].size(), vec![10, 512]);
        let n: i64 = vs
            .trainable_variables()
            .iter()
            .map(|t| t.numel() as i64)
            .sum();
        assert_eq!(n, 11_181_642, "ResNet-18 parameter count for 10 classes");
        let y = net.forward_t(&Tensor::zeros([2, 3, 32, 32], tch::kind::FLOAT_CPU), true);
        assert_eq!(y.size(), vec![2, 10]);
    }

    #[test]
    fn resnet50_narrow() {
        let vs = VarStore::new(Device::Cpu);
        let net = resnet(&vs.root(), Depth::R50, 8, 10, None);
        let vars = vs.variables();
        assert_eq!(vars["layer1.0.conv3.weight"].size(), vec![32, 8, 1, 1]);
        assert_eq!(vars["fc.weight"].size(), vec![10, 256]);
        let y = net.forward_t(&Tensor::zeros([2, 3, 32, 32], tch::kind::FLOAT_CPU), false);
        assert_eq!(y.size(), vec![2, 10]);
    }
}
