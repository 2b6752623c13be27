"""Nine Hugging Face model families with small random-weight configs, for
checking the battery's rules on real model code. Not a test dependency:

    .venv/bin/python -m pip install transformers     # or: pip install --target DIR transformers, PYTHONPATH=DIR
    .venv/bin/python tests/battery/run.py --models tests.battery.hf_models

Dropout is switched off everywhere (config and functional calls), so two
correct devices run the same arithmetic up to rounding."""

import torch


def _families():
    import transformers as T

    return {
        "bert": lambda: T.BertForMaskedLM(T.BertConfig(
            vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=64)),
        "bart": lambda: T.BartForConditionalGeneration(T.BartConfig(
            vocab_size=300, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64)),
        "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(
            vocab_size=300, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
            decoder_start_token_id=0, pad_token_id=0)),
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(
            vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)),
        "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(
            vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)),
        "vit": lambda: T.ViTForImageClassification(T.ViTConfig(
            image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, num_labels=10)),
        "resnet": lambda: T.ResNetForImageClassification(T.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10)),
        "convnext": lambda: T.ConvNextForImageClassification(T.ConvNextConfig(
            num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10, image_size=32)),
        "wav2vec2": lambda: T.Wav2Vec2ForSequenceClassification(T.Wav2Vec2Config(
            vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_feat_extract_layers=2,
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, num_labels=10, layerdrop=0.0,
            mask_time_prob=0.0)),
    }


FAMILIES = ["bert", "bart", "t5", "llama", "qwen2", "vit", "resnet", "convnext", "wav2vec2"]


def _batch(family, g):
    if family in ("vit", "resnet", "convnext"):
        return dict(pixel_values=torch.randn(4, 3, 32, 32, generator=g),
                    labels=torch.randint(0, 10, (4,), generator=g))
    if family == "wav2vec2":
        return dict(input_values=torch.randn(4, 800, generator=g), labels=torch.randint(0, 10, (4,), generator=g))
    ids = torch.randint(0, 300, (4, 32), generator=g)
    if family in ("bart", "t5"):
        return dict(input_ids=ids, labels=torch.randint(0, 300, (4, 16), generator=g))
    return dict(input_ids=ids, labels=ids.clone())


def _no_dropout(model):
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        # Modules that call F.dropout with a float attribute (BART, T5).
        for k, v in list(vars(m).items()):
            if "dropout" in k and isinstance(v, float):
                setattr(m, k, 0.0)


def train(family, device, steps=2, seed=0, dtype=None):
    """`steps` AdamW steps of `family` on `device` (its parameters in
    `dtype`, when given); returns the losses."""
    torch.manual_seed(seed)
    model = _families()[family]()
    _no_dropout(model)
    model.train()
    g = torch.Generator().manual_seed(seed + 1)
    batches = [_batch(family, g) for _ in range(steps)]
    model = model.to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for b in batches:
        loss = model(**{k: v.to(device) for k, v in b.items()}).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.float().item()))
    return losses
