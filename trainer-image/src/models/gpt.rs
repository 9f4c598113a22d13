//! A GPT-style decoder-only transformer language model (pre-LayerNorm,
//! causal self-attention, GELU MLP); names follow GPT-2 (`wte`, `wpe`,
//! `h.<i>.attn.c_attn`, `ln_f`, `lm_head`).

use tch::nn::{self, Module};
use tch::{Kind, Tensor};

/// Size knobs.
#[derive(Clone, Copy, Debug)]
pub struct GptConfig {
    pub vocab: i64,
    pub context: i64,
    pub layers: i64,
    pub heads: i64,
    pub width: i64,
}

fn block(p: nn::Path, c: GptConfig) -> impl Module {
    let ln_1 = nn::layer_norm(&p / "ln_1", vec![c.width], Default::default());
    let c_attn = nn::linear(
        &p / "attn" / "c_attn",
        c.width,
        3 * c.width,
        Default::default(),
    );
    let a_proj = nn::linear(&p / "attn" / "c_proj", c.width, c.width, Default::default());
    let ln_2 = nn::layer_norm(&p / "ln_2", vec![c.width], Default::default());
    let c_fc = nn::linear(
        &p / "mlp" / "c_fc",
        c.width,
        4 * c.width,
        Default::default(),
    );
    let m_proj = nn::linear(
        &p / "mlp" / "c_proj",
        4 * c.width,
        c.width,
        Default::default(),
    );
    let (nh, hd) = (c.heads, c.width / c.heads);
    nn::func(move |x| {
        let (b, t, w) = x.size3().unwrap_or((1, 1, c.width));
        let qkv = c_attn.forward(&ln_1.forward(x));
        let split = qkv.split(w, 2);
        let heads = |t_: &Tensor| t_.view([b, t, nh, hd]).transpose(1, 2);
        let y = Tensor::scaled_dot_product_attention(
            &heads(&split[0]),
            &heads(&split[1]),
            &heads(&split[2]),
            None::<Tensor>,
            0.0,
            true,
            None,
            false,
        );
        let y = y.transpose(1, 2).contiguous().view([b, t, w]);
        let x = x + a_proj.forward(&y);
        let h = c_fc.forward(&ln_2.forward(&x)).gelu("tanh");
        &x + m_proj.forward(&h)
    })
}

/// Token ids `[B, T]` → logits `[B, T, vocab]`.
pub fn gpt(p: &nn::Path, c: GptConfig) -> nn::Func<'static> {
    let emb = nn::EmbeddingConfig::default();
    let wte = nn::embedding(p / "wte", c.vocab, c.width, emb);
    let wpe = nn::embedding(p / "wpe", c.context, c.width, emb);
    let blocks: Vec<_> = (0..c.layers).map(|i| block(p / "h" / i, c)).collect();
    let ln_f = nn::layer_norm(p / "ln_f", vec![c.width], Default::default());
    let lm_head = nn::linear(
        p / "lm_head",
        c.width,
        c.vocab,
        nn::LinearConfig {
            bias: false,
            ..Default::default()
        },
    );
    nn::func(move |idx| {
        let t = idx.size()[1];
        let pos = Tensor::arange(t, (Kind::Int64, idx.device()));
        let mut x = wte.forward(idx) + wpe.forward(&pos);
        for b in &blocks {
            x = b.forward(&x);
        }
        lm_head.forward(&ln_f.forward(&x))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_names() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let c = GptConfig {
            vocab: 50,
            context: 16,
            layers: 2,
            heads: 4,
            width: 32,
        };
        let m = gpt(&vs.root(), c);
        let x = Tensor::zeros([3, 16], (Kind::Int64, tch::Device::Cpu));
        assert_eq!(m.forward(&x).size(), vec![3, 16, 50]);
        let v = vs.variables();
        assert_eq!(v["h.1.attn.c_attn.weight"].size(), vec![96, 32]);
        assert!(v.contains_key("lm_head.weight") && !v.contains_key("lm_head.bias"));
    }
}
