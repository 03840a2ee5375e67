//! The named models. Each family lives in its own file and exposes builder functions
//! of type [`BuildFn`]; the [`catalog`] below names them as the CLI spells them.

use crate::{Dims, Model, ModelOptions, Network, ZooError};

mod densenet;
mod gpt2;
mod inception;
mod llama;
mod mlp;
mod phi2;
mod resnet;
mod siamese;
mod transformer;
mod unet;
mod vgg;

/// Builds a network from resolved sizes.
pub type BuildFn = fn(&Dims) -> Result<Network, ZooError>;

/// A catalog entry.
#[derive(Debug)]
pub struct ModelSpec {
    /// The name the CLI takes.
    pub name: &'static str,
    /// Family (`resnet`, `gpt2`, ...).
    pub family: &'static str,
    /// One line about it.
    pub description: &'static str,
    /// The published parameter count and where it is from, if any.
    pub published_params: Option<(u64, &'static str)>,
    /// Default batch size.
    pub batch: usize,
    /// Default image side, for vision models.
    pub image: Option<usize>,
    /// Default sequence length, for sequence models.
    pub seq: Option<usize>,
    /// Default layer count, for models whose depth `--layers` may change.
    pub layers: Option<usize>,
    /// The longest sequence the model takes (its learned positions or its context).
    pub max_seq: Option<usize>,
    /// Default width (channels or embedding size), for models whose width `--width` may change.
    pub width: Option<usize>,
    /// Default attention heads, for models whose head count `--heads` may change.
    pub heads: Option<usize>,
    /// The builder.
    pub build: BuildFn,
}

const TV: &str = "torchvision";
const HF: &str = "Hugging Face";

macro_rules! spec {
    // The most specific arms come first: an `expr` fragment, once parsed, is not retried.
    ($name:expr, $family:expr, $desc:expr, $params:expr, batch $b:expr, image $i:expr, seq $s:expr, max_seq $ms:expr, layers $l:expr, width $w:expr, heads $h:expr, $build:expr) => {
        ModelSpec { name: $name, family: $family, description: $desc, published_params: $params, batch: $b, image: $i, seq: $s, max_seq: $ms, layers: $l, width: $w, heads: $h, build: $build }
    };
    ($name:expr, $family:expr, $desc:expr, $params:expr, batch $b:expr, image $i:expr, seq $s:expr, max_seq $ms:expr, layers $l:expr, $build:expr) => {
        spec!($name, $family, $desc, $params, batch $b, image $i, seq $s, max_seq $ms, layers $l, width None, heads None, $build)
    };
    ($name:expr, $family:expr, $desc:expr, $params:expr, batch $b:expr, image $i:expr, seq $s:expr, layers $l:expr, $build:expr) => {
        spec!($name, $family, $desc, $params, batch $b, image $i, seq $s, max_seq None, layers $l, $build)
    };
}

static CATALOG: &[ModelSpec] = &[
    spec!("mlp", "mlp", "A perceptron of `--layers` layers, `--width` wide (tests and examples)", None, batch 32, image None, seq None, max_seq None, layers Some(4), width Some(1024), heads None, mlp::mlp),
    spec!("resnet", "resnet", "A ResNet of basic blocks: `--layers` blocks per stage, `--width` channels in the first", None, batch 8, image Some(64), seq None, max_seq None, layers Some(2), width Some(64), heads None, resnet::resnet_custom),
    spec!("resnet18", "resnet", "ResNet-18 (He et al. 2016)", Some((11_689_512, TV)), batch 32, image Some(224), seq None, layers None, resnet::resnet18),
    spec!("resnet34", "resnet", "ResNet-34", Some((21_797_672, TV)), batch 32, image Some(224), seq None, layers None, resnet::resnet34),
    spec!("resnet50", "resnet", "ResNet-50", Some((25_557_032, TV)), batch 32, image Some(224), seq None, layers None, resnet::resnet50),
    spec!("resnet101", "resnet", "ResNet-101", Some((44_549_160, TV)), batch 32, image Some(224), seq None, layers None, resnet::resnet101),
    spec!("resnet152", "resnet", "ResNet-152", Some((60_192_808, TV)), batch 32, image Some(224), seq None, layers None, resnet::resnet152),
    spec!("resnet200", "resnet", "ResNet-200 (bottleneck [3, 24, 36, 3])", resnet::RESNET200_PARAMS, batch 8, image Some(224), seq None, layers None, resnet::resnet200),
    spec!("resnet1001", "resnet", "ResNet-1001 (bottleneck, 333 blocks; Rotor's deepest chain)", resnet::RESNET1001_PARAMS, batch 8, image Some(224), seq None, layers None, resnet::resnet1001),
    spec!("vgg16", "vgg", "VGG-16", Some((138_357_544, TV)), batch 32, image Some(224), seq None, layers None, vgg::vgg16),
    spec!("densenet121", "densenet", "DenseNet-121", Some((7_978_856, TV)), batch 32, image Some(224), seq None, layers None, densenet::densenet121),
    spec!("densenet161", "densenet", "DenseNet-161", Some((28_681_000, TV)), batch 32, image Some(224), seq None, layers None, densenet::densenet161),
    spec!("densenet169", "densenet", "DenseNet-169", Some((14_149_480, TV)), batch 32, image Some(224), seq None, layers None, densenet::densenet169),
    spec!("densenet201", "densenet", "DenseNet-201", Some((20_013_928, TV)), batch 32, image Some(224), seq None, layers None, densenet::densenet201),
    spec!("inception_v3", "inception", "Inception-v3", inception::INCEPTION_V3_PARAMS, batch 32, image Some(299), seq None, layers None, inception::inception_v3),
    spec!("gpt", "gpt2", "A GPT-2 of any depth (`--layers`), width (`--width`) and heads (`--heads`), 1,024-token vocabulary", None, batch 4, image None, seq Some(128), max_seq Some(gpt2::POSITIONS), layers Some(4), width Some(256), heads Some(4), gpt2::custom),
    spec!("gpt2-small", "gpt2", "GPT-2 small (12 layers, 768 wide)", Some((124_439_808, HF)), batch 4, image None, seq Some(1024), max_seq Some(gpt2::POSITIONS), layers Some(12), gpt2::small),
    spec!("gpt2-medium", "gpt2", "GPT-2 medium (24 layers, 1024 wide)", Some((354_823_168, HF)), batch 4, image None, seq Some(1024), max_seq Some(gpt2::POSITIONS), layers Some(24), gpt2::medium),
    spec!("gpt2-large", "gpt2", "GPT-2 large (36 layers, 1280 wide)", Some((774_030_080, HF)), batch 4, image None, seq Some(1024), max_seq Some(gpt2::POSITIONS), layers Some(36), gpt2::large),
    spec!("gpt2-xl", "gpt2", "GPT-2 xl (48 layers, 1600 wide)", Some((1_557_611_200, HF)), batch 4, image None, seq Some(1024), max_seq Some(gpt2::POSITIONS), layers Some(48), gpt2::xl),
    spec!("transformer", "transformer", "Encoder-decoder Transformer (Vaswani et al. 2017, base)", transformer::TRANSFORMER_PARAMS, batch 8, image None, seq Some(512), layers Some(6), transformer::transformer),
    spec!("unet", "unet", "U-Net (Ronneberger et al. 2015)", unet::UNET_PARAMS, batch 8, image Some(256), seq None, layers None, unet::unet),
    spec!("siamese", "siamese", "Siamese two-branch network with shared weights", None, batch 32, image Some(128), seq None, layers None, siamese::siamese),
    spec!("llama2-7b", "llama", "Llama-2-7B", Some((6_738_415_616, HF)), batch 1, image None, seq Some(512), max_seq Some(llama::MAX_SEQ), layers Some(32), llama::llama2_7b),
    spec!("llama2-13b", "llama", "Llama-2-13B", Some((13_015_864_320, HF)), batch 1, image None, seq Some(512), max_seq Some(llama::MAX_SEQ), layers Some(40), llama::llama2_13b),
    spec!("phi2", "phi", "Phi-2", Some((2_779_683_840, HF)), batch 1, image None, seq Some(512), max_seq Some(phi2::MAX_SEQ), layers Some(32), phi2::phi2),
];

/// The largest value of each size option: far beyond any model trained today, and low
/// enough that no shape the builders compute from them overflows (the step's total is
/// checked after building, [`MAX_STEP_BYTES`](crate::MAX_STEP_BYTES)).
const OPTION_LIMITS: &[(&str, usize)] = &[
    ("batch", crate::MAX_BATCH),
    ("image", 1 << 14),
    ("seq", 1 << 17),
    ("layers", 10_000),
    ("width", 1 << 14),
    ("heads", 1 << 12),
];

/// Every model, in catalog order.
pub fn catalog() -> &'static [ModelSpec] {
    CATALOG
}

/// Builds a model by name, resolving the options against its defaults.
pub fn build(name: &str, options: &ModelOptions) -> Result<Model, ZooError> {
    let spec = CATALOG.iter().find(|s| s.name == name).ok_or_else(|| ZooError::UnknownModel {
        name: name.to_string(),
        known: CATALOG.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
    })?;
    let bad = |option: &'static str, why: String| ZooError::BadOption { model: name.to_string(), option, why };
    let pick = |option: &'static str, given: Option<usize>, default: Option<usize>| -> Result<usize, ZooError> {
        let limit = OPTION_LIMITS.iter().find(|(name, _)| *name == option).map_or(usize::MAX, |&(_, l)| l);
        match (given, default) {
            (Some(0), _) => Err(bad(option, "must be positive".into())),
            (Some(v), Some(_)) if v > limit => {
                Err(bad(option, format!("{v} is beyond any model pebble plans (at most {limit})")))
            }
            (Some(v), Some(_)) => Ok(v),
            (Some(_), None) => Err(bad(option, "does not apply to this model".into())),
            (None, d) => Ok(d.unwrap_or(0)),
        }
    };
    let dims = Dims {
        batch: pick("batch", options.batch, Some(spec.batch))?,
        image: pick("image", options.image, spec.image)?,
        seq: pick("seq", options.seq, spec.seq)?,
        layers: pick("layers", options.layers, spec.layers)?,
        width: pick("width", options.width, spec.width)?,
        heads: pick("heads", options.heads, spec.heads)?,
        dtype: options.dtype,
    };
    if let Some(max) = spec.max_seq.filter(|&max| dims.seq > max) {
        return Err(bad("seq", format!("{} exceeds the model's {max} positions", dims.seq)));
    }
    let network = (spec.build)(&dims)?;
    Model::from_network(spec, dims, network, options)
}
