"""Training with optax, gin-configured: both model families, exact resume, distillation.

`python -m specjax.train --gin_file=runs/train_lm.gin` runs `train` (see `trainer`).
"""
from specjax.models.model_gin import MODEL_GIN, model_gin_text
from specjax.train.batches import Batches, DataConfig, make_batches, make_features
from specjax.train.checkpoints import (OPT_STATE_FILE, TRAIN_STATE_FILE, check_model_gin,
                                       list_checkpoints, load_opt_state, restore,
                                       resume_fingerprint, save_checkpoint, save_opt_state)
from specjax.train.distill import DistillConfig, Teacher, load_teacher
from specjax.train.feature_head import (FeatureHeadTraining, load_head, load_target,
                                        RANKING_FILE, load_token_ranking, token_ranking,
                                        train_feature_head)
from specjax.train.trainer import (METRICS_FILE, OptimizerConfig, TrainConfig, Trainer,
                                   TrainResult, TrainState, cross_entropy, get_trainer,
                                   make_optimizer, make_schedule, summarize, train)

__all__ = ["train", "Trainer", "TrainState", "TrainResult", "TrainConfig",
           "OptimizerConfig", "DataConfig", "DistillConfig", "Teacher", "load_teacher",
           "Batches", "make_batches", "make_features", "get_trainer", "make_optimizer",
           "make_schedule", "cross_entropy", "summarize", "save_checkpoint", "restore",
           "list_checkpoints", "save_opt_state", "load_opt_state", "check_model_gin",
           "OPT_STATE_FILE", "TRAIN_STATE_FILE", "METRICS_FILE", "MODEL_GIN", "model_gin_text",
           "resume_fingerprint", "FeatureHeadTraining", "train_feature_head", "load_head",
           "load_target", "load_token_ranking", "token_ranking", "RANKING_FILE"]
