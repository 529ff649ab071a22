"""A Tinker-compatible training service: the `tinker` SDK's training and sampling API (ServiceClient,
TrainingClient.forward_backward / optim_step / save_state / load_state / save_weights_and_get_sampling_client,
SamplingClient.sample) served on this project's Paddle LLaMA with LoRA. docs/tinker.md describes what works.

wire.py      the protobuf messages (forward_backward's request, its output, sample responses)
losses.py    cross_entropy, importance_sampling, ppo as pure functions
training.py  a LoRA training model: forward_backward, Adam steps, checkpoints
sampling.py  sampling clients' models and the decode engine call
service.py   sessions, models, samplers, checkpoints and futures
http.py      the routes, the API key, the threaded server
"""
