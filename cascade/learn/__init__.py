"""Distillation: fine-tune the cheap tier's Laya checkpoint toward the strong tier's answers."""
