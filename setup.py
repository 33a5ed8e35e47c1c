"""tf_transformer: the Transformer of "Attention Is All You Need" in TF/Keras."""

import pathlib
import re

import setuptools

HERE = pathlib.Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"',
                    (HERE / "tf_transformer" / "__init__.py").read_text()).group(1)

COMMANDS = sorted(p.stem for p in (HERE / "tf_transformer" / "cli").glob("*.py")
                  if p.stem != "__init__")

setuptools.setup(
    name="tf_transformer",
    version=VERSION,
    description="The Transformer (Vaswani et al., 2017) in TensorFlow/Keras 3: "
                "training, beam search and a TF Serving export.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.13",
    packages=setuptools.find_packages(include=["tf_transformer",
                                               "tf_transformer.*"]),
    # One prefix, so that no command shadows another program's; bin/*.py
    # are the same commands run from a clone. The measuring tools
    # (benchmarks/) are not installed.
    entry_points={"console_scripts": [
        f"tf-transformer-{name.replace('_', '-')}=tf_transformer.cli.{name}:run"
        for name in COMMANDS]},
    install_requires=[
        "tensorflow~=2.21.0",
        # tensorflow-text's custom ops are built against one TF minor version.
        "tensorflow-text~=2.21.0",
        "keras>=3.10,<4",
        # Summaries' hparams plugin; TensorFlow 2.21 no longer installs it.
        "tensorboard~=2.21.0",
        "tensorflow-datasets>=4.9",
        "sacrebleu>=2.4,<3",
        "absl-py>=2.1",
        # The field's standard subword trainer (section 5.1's BPE vocabulary);
        # tensorflow-text only runs trained models.
        "sentencepiece>=0.2",
        # Number words in many languages, for the embedded `numbers` task.
        "num2words>=0.5.13",
        # The field's standard plotting library: the attention images in
        # TensorBoard and bin/plot_attention.py, labelled with their tokens.
        "matplotlib>=3.8",
    ],
    extras_require={
        # bin/serving_client.py --protocol=grpc: TF Serving's own gRPC stubs.
        "serving": ["tensorflow-serving-api~=2.21.0"],
        # bin/export.py --format=ctranslate2 and translating with its output:
        # CTranslate2, the C++ engine OpenNMT-tf users serve with.
        "ctranslate2": ["ctranslate2>=4.5,<5"],
        # Importing published Marian / OPUS-MT models
        # (interop/marian.py): safetensors, the format Transformers
        # saves them in; PyYAML, for Marian's model.yml and *.vocab.yml
        # (interop/marian_npz.py); huggingface_hub, whose `hf download`
        # fetches them from the Hugging Face hub.
        "marian": ["safetensors>=0.4", "pyyaml>=6", "huggingface_hub>=1.0"],
        # The benchmark's LiteRT rows (`--sections=litert_step`):
        # ai-edge-litert, TensorFlow's own runtime for CPUs and devices
        # (XNNPACK kernels, int8 weights).
        "litert": ["ai-edge-litert>=2.3,<3"],
        # pytest-xdist: the suite in two processes (`-n 2`), half the time.
        # jax (its CPU build): Keras' JAX backend, on which the layers and
        # the model's training path are tested too (tests/test_backends.py).
        # torch (pinned; CONTRIBUTING.md says how to take its CPU build,
        # which pip does not choose on Linux) and transformers: the
        # reference an imported MarianMTModel is tested against
        # (tests/test_marian_import.py).
        "test": ["pytest>=8", "pytest-xdist>=3.5",
                 "tensorflow-serving-api~=2.21.0", "matplotlib>=3.8",
                 "ctranslate2>=4.5,<5", "jax>=0.5", "safetensors>=0.4",
                 "pyyaml>=6", "ai-edge-litert>=2.3,<3",
                 "torch==2.13.0", "transformers>=5,<6"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
