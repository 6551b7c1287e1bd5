"""A tiny mixture of experts that trains here: the default model with every block's MLP replaced
by 8 experts of a quarter of its width, 2 a token (as many active MLP weights as the dense
model's half), on 4 fake devices with the sequence over all 4.

    python train.py --config configs/moe_tiny.py --workdir runs/moe_tiny
    python train.py --config configs/moe_tiny.py --workdir /tmp/moe --config.mesh.expert=4
        # the 8 experts split over the 4 devices that split the sequence: 2 each

The progress line and metrics.jsonl carry the experts' shares of the routed tokens (the largest
over layers: moe/share_max; each layer's largest and smallest), the balance and z losses; the
balance loss (weight 0.01, as Mixtral's) pulls the largest share towards 1 / 8 over training.
"""

from configs import default


def get_config():
    config = default.get_config()
    config.model.moe.num_experts = 8  # experts per block
    config.model.moe.top_k = 2  # experts each token goes to
    config.model.moe.expert_mlp_dim = 96  # each expert's width: a quarter of mlp_dim (384)
    config.model.moe.aux_loss_coef = 0.01  # load-balancing loss weight (Mixtral's)
    config.model.moe.z_loss_coef = 0.001  # router z-loss weight (ST-MoE's)
    return config
