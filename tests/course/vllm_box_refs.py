"""Where each row of the chapters' "nanoengine → vLLM 0.33" boxes stands in both code bases, as (chapter, row title,
vLLM references, nanoengine references); a reference is (path, text on one line of it[, which occurrence]).
tests/course/test_vllm_boxes.py checks the nanoengine side on every run and the vLLM side where an unpacked
vLLM 0.33 is at hand (VLLM_SRC)."""

ROWS = []


def R(chapter, title, vllm_refs, nanoengine_refs):
    ROWS.append((chapter, title, vllm_refs, nanoengine_refs))


# 00
R(
    "00",
    "LLM() default model",
    [
        ("vllm/vllm/entrypoints/llm.py", "        model: str,"),
        ("vllm/vllm/entrypoints/llm.py", "        **kwargs: Any,"),
        ("vllm/vllm/entrypoints/llm.py", "        engine_args = EngineArgs("),
    ],
    [
        ("nanoengine/entrypoints/llm.py", "model: str | os.PathLike | LlamaForCausalLM | None = None"),
        (
            "nanoengine/entrypoints/llm.py",
            "        self.engine = LLMEngine.from_engine_args(EngineArgs.from_kwargs(model, kwargs))",
        ),
        ("nanoengine/engine/arg_utils.py", "class EngineArgs:"),
    ],
)
R(
    "00",
    "LLM.chat return type and messages",
    [
        ("vllm/vllm/entrypoints/llm.py", "    def chat("),
        ("vllm/vllm/entrypoints/llm.py", "    ) -> list[RequestOutput]:", 2),
    ],
    [("nanoengine/entrypoints/llm.py", "    def chat(\n        self,\n        messages: list[dict] | str,")],
)
R(
    "00",
    "RequestOutput short forms",
    [
        ("vllm/vllm/outputs.py", "class RequestOutput:"),
        ("vllm/vllm/outputs.py", "        self.metrics = metrics"),
        ("vllm/vllm/outputs.py", "    text: str"),
        ("vllm/vllm/v1/metrics/stats.py", "class RequestStateStats:"),
    ],
    [
        ("nanoengine/outputs.py", "    def text(self) -> str:"),
        ("nanoengine/outputs.py", "    def ttft(self) -> float:"),
        ("nanoengine/outputs.py", "    def decode_tokens_per_s(self) -> float:"),
    ],
)
R(
    "00",
    "LLM.stream",
    [
        ("vllm/vllm/entrypoints/llm.py", "intended to be used for offline inference"),
        ("vllm/vllm/v1/engine/async_llm.py", "    async def generate("),
        ("vllm/vllm/v1/engine/async_llm.py", ") -> AsyncGenerator[RequestOutput, None]:"),
    ],
    [("nanoengine/entrypoints/llm.py", "    def stream(self, prompt: str")],
)
R(
    "00",
    "SamplingParams.top_k default",
    [
        ("vllm/vllm/sampling_params.py", "    top_k: int = 0"),
        ("vllm/vllm/sampling_params.py", "Set to 0 (or -1)"),
        ("vllm/vllm/sampling_params.py", "            self.top_k = 0"),
        ("vllm/vllm/sampling_params.py", "_SAMPLING_EPS = 1e-5"),
    ],
    [("nanoengine/sampling_params.py", "    top_k: int = -1")],
)

# 01
R(
    "01",
    "model forward signature and forward context",
    [
        (
            "vllm/vllm/model_executor/models/llama.py",
            "        intermediate_tensors: IntermediateTensors | None = None,",
        ),
        ("vllm/vllm/model_executor/models/llama.py", "        attn_output = self.attn(q, k, v)"),
        (
            "vllm/vllm/model_executor/layers/attention/attention.py",
            "    forward_context: ForwardContext = get_forward_context()",
        ),
        (
            "vllm/vllm/model_executor/layers/attention/attention.py",
            "        attn_metadata = attn_metadata_raw[layer_name]",
        ),
        (
            "vllm/vllm/model_executor/layers/attention/attention.py",
            "    attn_layer: Attention | MLAAttention = forward_context.no_compile_layers[layer_name]",
        ),
        ("vllm/vllm/forward_context.py", "def get_forward_context()"),
    ],
    [
        (
            "nanoengine/model/llama.py",
            "    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext)",
        ),
        ("nanoengine/model/llama.py", "        o = attn(self.layer_idx, q, k, qkv[:, qk_size:].reshape"),
    ],
)
R(
    "01",
    "linear layers return (output, bias)",
    [
        ("vllm/vllm/model_executor/models/llama.py", "        qkv, _ = self.qkv_proj(hidden_states)"),
        ("vllm/vllm/model_executor/models/llama.py", "        x, _ = self.gate_up_proj(x)"),
        ("vllm/vllm/model_executor/layers/linear.py", "        return output, output_bias"),
    ],
    [
        ("nanoengine/model/llama.py", "        qkv = self.qkv_proj(x)"),
        ("nanoengine/model/llama.py", "class Linear(nn.Linear):"),
    ],
)
R(
    "01",
    "RoPE placement",
    [
        ("vllm/vllm/model_executor/models/llama.py", "        self.rotary_emb = get_rope("),
        ("vllm/vllm/model_executor/models/llama.py", "        q, k = self.rotary_emb(positions, q, k)"),
        ("vllm/vllm/model_executor/models/llama.py", "        is_neox_style = True"),
    ],
    [
        ("nanoengine/model/llama.py", "        rope = self.rotary_emb(positions)"),
        ("nanoengine/model/llama.py", "def apply_rotary("),
    ],
)
R(
    "01",
    "decoder layer returns (hidden, residual)",
    [
        ("vllm/vllm/model_executor/models/llama.py", "    ) -> tuple[torch.Tensor, torch.Tensor]:"),
        (
            "vllm/vllm/model_executor/models/llama.py",
            "            hidden_states, residual = self.input_layernorm(hidden_states, residual)",
        ),
    ],
    [("nanoengine/model/llama.py", "        x = x + self.self_attn(rope, self.input_layernorm(x), attn)")],
)
R(
    "01",
    "KV cache tensors per layer",
    [
        ("vllm/vllm/v1/worker/utils.py", "def allocate_kv_cache("),
        ("vllm/vllm/v1/worker/utils.py", "    buf = torch.zeros(buf_size, dtype=torch.int8, device=device)"),
        ("vllm/vllm/v1/kv_cache_interface.py", "def create_kv_cache_views("),
        (
            "vllm/vllm/v1/kv_cache_interface.py",
            "        return (self.head_size + self.head_size_v) * get_dtype_size(self.dtype)",
        ),
        ("vllm/vllm/v1/kv_cache_layout.py", "class KVCacheLayout(Enum):"),
    ],
    [
        ("nanoengine/attention/paged.py", "        self.k_caches = [torch.zeros(shape"),
        (
            "nanoengine/attention/paged.py",
            "        shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)",
        ),
    ],
)
R(
    "01",
    "pool sizing: gpu_memory_utilization",
    [
        ("vllm/vllm/config/cache.py", "    gpu_memory_utilization: float = Field(default=0.92"),
        ("vllm/vllm/v1/worker/utils.py", "        init_snapshot.total_memory * cache_config.gpu_memory_utilization"),
        ("vllm/vllm/v1/worker/gpu_worker.py", "    def determine_available_memory(self) -> int:"),
        ("vllm/vllm/v1/worker/gpu_worker.py", "            - profile_result.non_kv_cache_memory"),
        ("vllm/vllm/config/cache.py", "    kv_cache_memory_bytes: int | None = None"),
    ],
    [
        ("nanoengine/worker/worker.py", "DEFAULT_CPU_KV_BYTES = 512 * 2**20"),
        ("nanoengine/config/cache.py", "    gpu_memory_utilization: float = 0.9"),
        ("nanoengine/worker/worker.py", "            budget = int(free * utilization)"),
        ("nanoengine/worker/worker.py", "    def get_kv_cache_config(self) -> KVCacheConfig:"),
    ],
)

# 02
R(
    "02",
    "BlockTable API",
    [
        ("vllm/vllm/v1/worker/block_table.py", "class BlockTable:"),
        ("vllm/vllm/v1/worker/block_table.py", "    def append_row("),
        ("vllm/vllm/v1/worker/block_table.py", "    def add_row(self, block_ids: list[int], row_idx: int)"),
        ("vllm/vllm/v1/worker/block_table.py", "    def compute_slot_mapping("),
        ("vllm/vllm/v1/worker/block_table.py", "        _COMPUTE_SLOT_MAPPING_KERNEL("),
        ("vllm/vllm/v1/worker/block_table.py", "    def commit_block_table(self, num_reqs: int)"),
        (
            "vllm/vllm/v1/worker/gpu_input_batch.py",
            "            self.block_table.move_row(last_req_index, empty_index)",
        ),
    ],
    [
        ("nanoengine/worker/block_table.py", "class BlockTable:"),
        (
            "nanoengine/worker/block_table.py",
            "    def compute_slot_mapping(self, req_id: str, start_pos: int, num_tokens: int)",
            2,
        ),
        ("nanoengine/worker/block_table.py", "    def get_block_tables(self, req_ids: list[str])", 2),
    ],
)
R(
    "02",
    "runner request state",
    [
        ("vllm/vllm/v1/worker/gpu_input_batch.py", "class CachedRequestState:"),
        ("vllm/vllm/v1/worker/gpu_input_batch.py", "    block_ids: tuple[list[int], ...]"),
        ("vllm/vllm/v1/worker/gpu_model_runner.py", "        self.requests: dict[str, CachedRequestState] = {}"),
        ("vllm/vllm/v1/worker/gpu_model_runner.py", "        self.input_batch = InputBatch("),
        ("vllm/vllm/v1/worker/gpu_input_batch.py", "        self.block_table = MultiGroupBlockTable("),
        ("vllm/vllm/v1/worker/gpu_model_runner.py", "    def _update_states(self"),
        ("vllm/vllm/v1/worker/gpu/model_runner.py", "    def finish_requests("),
        ("vllm/vllm/v1/worker/gpu/model_runner.py", "    def add_requests("),
        ("vllm/vllm/v1/worker/gpu/model_runner.py", "    def update_requests("),
        ("vllm/vllm/v1/worker/gpu/states.py", "class RequestState:"),
    ],
    [
        ("nanoengine/worker/model_runner.py", "class CachedRequestState:"),
        ("nanoengine/worker/model_runner.py", "        self.requests: dict[str, CachedRequestState] = {}"),
        ("nanoengine/worker/model_runner.py", "    def _update_states(self, so: SchedulerOutput)"),
    ],
)
R(
    "02",
    "get_block_ids shape",
    [
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            "    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:",
        ),
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            "        return tuple([blk.block_id for blk in group] for group in groups)",
        ),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "        allow_none: bool = False,"),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "        group_ids: Sequence[int] | None = None,"),
    ],
    [
        (
            "nanoengine/core/kv_cache_manager.py",
            "    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:",
            2,
        ),
        ("nanoengine/core/kv_cache_manager.py", "    def get_block_ids(self) -> tuple[list[int], ...]:"),
        (
            "nanoengine/core/kv_cache_manager.py",
            "        return tuple([block.block_id for block in group] for group in self.blocks)",
        ),
    ],
)
R(
    "02",
    "CachedRequestData.new_block_ids None",
    [
        ("vllm/vllm/v1/core/sched/output.py", "    new_block_ids: list[tuple[list[int], ...] | None]"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                req_to_new_blocks[req_id].get_block_ids(allow_none=True)",
        ),
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            "        if allow_none and all(len(group) == 0 for group in groups):",
        ),
    ],
    [
        (
            "nanoengine/core/sched/output.py",
            "    new_block_ids: list[tuple[list[int], ...]] = field(default_factory=list)",
        ),
        ("nanoengine/core/sched/scheduler.py", "            new_blocks[request.request_id] = blocks.get_block_ids()"),
    ],
)
R(
    "02",
    "CommonAttentionMetadata vs AttentionMetadata",
    [
        ("vllm/vllm/v1/attention/backend.py", "class CommonAttentionMetadata:"),
        ("vllm/vllm/v1/attention/backend.py", "    block_table_tensor: torch.Tensor"),
        ("vllm/vllm/v1/attention/backends/utils.py", "def split_decodes_and_prefills("),
        ("vllm/vllm/v1/attention/backends/utils.py", "def reorder_batch_to_split_decodes_and_prefills("),
    ],
    [
        ("nanoengine/attention/backend.py", "class AttentionMetadata:"),
        ("nanoengine/attention/backend.py", "    num_decodes: int"),
        ("nanoengine/worker/model_runner.py", "    def batch_order("),
    ],
)

# 03
R(
    "03",
    "one unified_attention call",
    [
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "    def forward("),
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "        unified_attention("),
        ("vllm/vllm/v1/attention/ops/triton_unified_attention.py", "def unified_attention("),
        (
            "vllm/vllm/v1/attention/ops/triton_unified_attention.py",
            "        grid = (total_num_q_blocks, num_kv_heads, num_par_softmax_segments)",
        ),
    ],
    [
        ("nanoengine/attention/paged.py", "            return be.decode(q, kc, vc"),
        ("nanoengine/attention/paged.py", "        out[nd:] = be.prefill("),
    ],
)
R(
    "03",
    "store as its own step",
    [
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "    def do_kv_cache_update("),
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "        triton_reshape_and_cache_flash("),
        ("vllm/vllm/v1/attention/ops/triton_reshape_and_cache_flash.py", "def triton_reshape_and_cache_flash("),
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "    forward_includes_kv_cache_update: bool = False"),
        ("vllm/vllm/v1/attention/backends/utils.py", "PAD_SLOT_ID = -1"),
        ("vllm/vllm/model_executor/layers/attention/attention.py", "def unified_kv_cache_update("),
    ],
    [
        ("nanoengine/attention/paged.py", "        be.store_kvcache(k, v, kc, vc, md.slot_mapping)"),
        ("nanoengine/attention/triton_kernels.py", "    if slot < 0:"),
    ],
)
R(
    "03",
    "one per-layer tensor split into K and V views",
    [
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "[num_blocks, num_kv_heads, block_size, 2 * head_size]"),
        (
            "vllm/vllm/v1/attention/backends/triton_attn.py",
            "        key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)",
        ),
        ("vllm/vllm/v1/attention/ops/triton_unified_attention.py", "    stride_k_cache_0: tl.int64"),
    ],
    [
        ("nanoengine/attention/paged.py", "        kc, vc = self.k_caches[slot], self.v_caches[slot]"),
        ("nanoengine/attention/triton_kernels.py", "    s_kb,\n    s_kt,\n    s_kh,\n    s_vb,\n    s_vt,\n    s_vh,"),
    ],
)
R(
    "03",
    "shape rules",
    [
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "        return block_size % 16 == 0"),
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "        return head_size >= 32"),
        (
            "vllm/vllm/v1/attention/ops/triton_unified_attention.py",
            "    head_size_padded = triton.next_power_of_2(head_size)",
        ),
    ],
    [
        (
            "nanoengine/config/engine.py",
            '        if self.parts.attention_backend.name == "triton" and not is_pow2(block_size, 8):',
        ),
        ("nanoengine/config/engine.py", "    def __post_init__(self) -> None:"),
        ("nanoengine/attention/triton_kernels.py", "    assert is_pow2(head_dim, 16)"),
        ("nanoengine/attention/backend.py", "def is_pow2("),
        ("nanoengine/attention/triton_kernels.py", "so no head_dim mask is needed"),
    ],
)
R(
    "03",
    "split-K segments and 3D threshold",
    [
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "NUM_PAR_SOFTMAX_SEGMENTS = 16"),
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "MIN_LAUNCH_GRID_SIZE_2D = 128"),
        (
            "vllm/vllm/v1/attention/backends/triton_attn.py",
            "        self.seq_threshold_3D = MIN_LAUNCH_GRID_SIZE_2D // self.num_heads_kv",
        ),
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "            self.num_par_softmax_segments = 64"),
        (
            "vllm/vllm/v1/attention/ops/triton_unified_attention.py",
            "        or num_seqs * triton.cdiv(max_seqlen_q, BLOCK_Q) > seq_threshold_3D",
        ),
    ],
    [
        ("nanoengine/attention/triton_kernels.py", "def choose_num_splits("),
        ("nanoengine/attention/triton_kernels.py", "PROGRAMS_PER_SM = 8"),
        ("nanoengine/attention/triton_kernels.py", "MIN_SPLIT_TOKENS = 256"),
        ("nanoengine/attention/triton_kernels.py", "MAX_SPLITS = 32"),
    ],
)
R(
    "03",
    "TritonAttentionMetadata",
    [
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "class TritonAttentionMetadata:"),
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "    seq_threshold_3D: int"),
    ],
    [("nanoengine/attention/backend.py", "class AttentionMetadata:")],
)

# 04
R(
    "04",
    "hash_block_tokens signature and input",
    [
        ("vllm/vllm/v1/core/kv_cache_utils.py", "def hash_block_tokens("),
        (
            "vllm/vllm/v1/core/kv_cache_utils.py",
            "        hash_function((parent_block_hash, curr_block_token_ids_tuple, extra_keys))",
        ),
        ("vllm/vllm/v1/core/kv_cache_utils.py", "    if not parent_block_hash:"),
    ],
    [
        ("nanoengine/core/kv_cache_utils.py", "def hash_block_tokens("),
        ("nanoengine/core/kv_cache_utils.py", "    data = (parent_block_hash or NONE_HASH) + _pack_tokens"),
    ],
)
R(
    "04",
    "hash functions and names",
    [
        ("vllm/vllm/utils/hashing.py", "def sha256(input: Any) -> bytes:"),
        ("vllm/vllm/utils/hashing.py", "    input_bytes = pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)"),
        ("vllm/vllm/utils/hashing.py", "    input_bytes = cbor2.dumps(input, canonical=True)"),
        ("vllm/vllm/utils/hashing.py", "def get_hash_fn_by_name("),
        ("vllm/vllm/config/cache.py", "PrefixCachingHashAlgo = Literal["),
        ("vllm/vllm/config/cache.py", '    prefix_caching_hash_algo: PrefixCachingHashAlgo = "sha256"'),
    ],
    [
        ("nanoengine/core/kv_cache_utils.py", "def sha256(data: bytes) -> bytes:"),
        ("nanoengine/core/kv_cache_utils.py", "_HASH_FUNCTIONS: dict[str, HashFn]"),
        ("nanoengine/engine/arg_utils.py", '    hash_algo: str = "xxhash"'),
        ("nanoengine/config/cache.py", '    hash_algo: str = "xxhash"'),
    ],
)
R(
    "04",
    "NONE_HASH root",
    [
        ("vllm/vllm/v1/core/kv_cache_utils.py", "def init_none_hash("),
        ("vllm/vllm/v1/core/kv_cache_utils.py", "    NONE_HASH = BlockHash(hash_fn(_NONE_HASH_SEED))"),
        ("vllm/vllm/v1/core/kv_cache_utils.py", "def resolve_none_hash_seed("),
        ("vllm/vllm/v1/core/kv_cache_utils.py", "        return os.urandom(32).hex()"),
        ("vllm/vllm/v1/core/kv_cache_utils.py", 'DEFAULT_NONE_HASH_SEED = "vllm-none-hash"'),
        ("vllm/vllm/v1/core/kv_cache_utils.py", "(see #12621)"),
    ],
    [
        ("nanoengine/core/kv_cache_utils.py", "NONE_HASH = make_none_hash()"),
        ("nanoengine/core/kv_cache_utils.py", 'DEFAULT_HASH_SEED = "nanoengine"'),
        ("nanoengine/core/kv_cache_utils.py", "    none_hash: BlockHash | None = None,"),
    ],
)
R(
    "04",
    "extra keys",
    [
        ("vllm/vllm/v1/core/kv_cache_utils.py", "def generate_block_hash_extra_keys("),
        (
            "vllm/vllm/v1/core/kv_cache_utils.py",
            '    return [("lora", lora_request.lora_name, lora_request.lora_path)]',
        ),
        ("vllm/vllm/v1/core/kv_cache_utils.py", '        [("cache_salt", request.cache_salt)]'),
        (
            "vllm/vllm/v1/core/kv_cache_utils.py",
            "        lora_extra_keys + mm_extra_keys + cache_salt_keys + prompt_embeds_keys",
        ),
        ("vllm/vllm/v1/core/kv_cache_utils.py", '    return [("prompt_embeds", embeds_hash)]'),
        ("vllm/vllm/v1/core/kv_cache_utils.py", "The adapter path is included"),
    ],
    [
        ("nanoengine/core/kv_cache_utils.py", "def generate_block_hash_extra_keys("),
        ("nanoengine/core/kv_cache_utils.py", "        keys += (request.lora_name,)"),
        ("nanoengine/core/kv_cache_utils.py", "        keys += (request.cache_salt,)"),
    ],
)
R(
    "04",
    "get_request_block_hasher",
    [
        ("vllm/vllm/v1/core/kv_cache_utils.py", "def get_request_block_hasher("),
        ("vllm/vllm/v1/request.py", "    def update_block_hashes(self) -> None:"),
    ],
    [
        ("nanoengine/core/kv_cache_utils.py", "def get_request_block_hasher("),
        ("nanoengine/core/kv_cache_utils.py", "    hash_block: BlockTokensHasher | None = None,"),
    ],
)
R(
    "04",
    "no collision check",
    [
        ("vllm/vllm/v1/core/block_pool.py", "    def get_cached_block("),
        ("vllm/vllm/v1/core/block_pool.py", "            block = self.cached_block_hash_to_block.get_one_block("),
    ],
    [
        ("nanoengine/core/block_pool.py", "        check_hash_collisions: bool = False,"),
        ("nanoengine/core/block_pool.py", "            self.num_collisions += 1"),
    ],
)

# 05
R(
    "05",
    "popleft_n check",
    [
        ("vllm/vllm/v1/core/kv_cache_utils.py", "        assert self.num_free_blocks >= n"),
        ("vllm/vllm/v1/core/kv_cache_utils.py", '            raise ValueError("No free blocks available")'),
        (
            "vllm/vllm/v1/core/block_pool.py",
            '            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")',
        ),
    ],
    [("nanoengine/core/kv_cache_utils.py", "        if not 0 <= n <= self.num_free_blocks:")],
)
R(
    "05",
    "remove exception",
    [
        (
            "vllm/vllm/v1/core/kv_cache_utils.py",
            '            raise RuntimeError(f"remove() called on an invalid block: {block}")',
        )
    ],
    [
        (
            "nanoengine/core/kv_cache_utils.py",
            '            raise ValueError(f"remove() called on a block that is not in the free queue',
        )
    ],
)
R(
    "05",
    "KVCacheBlock fields and equality",
    [
        ("vllm/vllm/v1/core/kv_cache_utils.py", "@dataclass(slots=True)"),
        ("vllm/vllm/v1/core/kv_cache_utils.py", '    pool: "BlockPool | None" = field('),
        ("vllm/vllm/v1/core/kv_cache_utils.py", "    _block_hash_num_tokens: int | None = None"),
        ("vllm/vllm/v1/core/kv_cache_utils.py", "    def set_block_hash("),
        ("vllm/vllm/v1/core/block_pool.py", "            if block.pool is not None and block.pool is not self:"),
    ],
    [
        ("nanoengine/core/kv_cache_utils.py", "@dataclass(slots=True, eq=False)"),
        (
            "nanoengine/core/kv_cache_utils.py",
            '            raise ValueError(f"Block {self.block_id} already has a hash; reset_hash() it first.")',
        ),
    ],
)
R(
    "05",
    "free queue seam",
    [
        ("vllm/vllm/v1/core/block_pool.py", "        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)"),
        ("vllm/vllm/v1/core/block_pool.py", "        num_gpu_blocks: int,"),
        ("vllm/vllm/v1/core/kv_cache_utils.py", "    def iter_blocks_after("),
    ],
    [
        ("nanoengine/core/block_pool.py", "        free_queue_cls: type[FreeBlockQueue] = FreeKVCacheBlockQueue,"),
        ("nanoengine/engine/arg_utils.py", "    free_queue_cls: type[FreeBlockQueue] | None = None"),
    ],
)

# 06
R(
    "06",
    "get_computed_blocks and stats",
    [
        ("vllm/vllm/v1/core/kv_cache_manager.py", "    def get_computed_blocks("),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "    ) -> tuple[KVCacheBlocks, int, int]:"),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "            max_cache_hit_length = request.num_tokens - 1"),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "        log_stats: bool = False,"),
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            "        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None",
        ),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                # Record at admission so unscheduled lookups are not counted.",
        ),
    ],
    [
        (
            "nanoengine/core/kv_cache_manager.py",
            "    def get_computed_blocks(self, request: Request, record_stats: bool = True)",
        ),
        ("nanoengine/core/kv_cache_manager.py", "        log_stats: bool = True,"),
    ],
)
R(
    "06",
    "KVCacheBlocks",
    [
        ("vllm/vllm/v1/core/kv_cache_manager.py", "class KVCacheBlocks:"),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "    blocks: tuple[Sequence[KVCacheBlock], ...]"),
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            "(a precomputed KVCacheBlocks is in KVCacheManager to avoid GC overhead)",
        ),
        ("vllm/vllm/v1/core/kv_cache_manager.py", '    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":'),
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            "        allow_none: bool = False,\n        *,\n        group_ids: Sequence[int] | None = None,",
        ),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "    ) -> KVCacheBlocks | None:"),
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            "        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks",
        ),
    ],
    [
        ("nanoengine/core/kv_cache_manager.py", "class KVCacheBlocks:"),
        ("nanoengine/core/kv_cache_manager.py", "    blocks: tuple[Sequence[KVCacheBlock], ...]"),
        ("nanoengine/core/kv_cache_manager.py", "    def get_block_ids(self) -> tuple[list[int], ...]:"),
        ("nanoengine/core/kv_cache_manager.py", "    ) -> KVCacheBlocks | None:", 2),
        ("nanoengine/core/kv_cache_manager.py", "        return KVCacheBlocks(new_blocks)"),
        (
            "nanoengine/core/kv_cache_manager.py",
            "        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in self.kv_cache_groups))",
        ),
    ],
)
R(
    "06",
    "allocate_slots signature and checks",
    [
        ("vllm/vllm/v1/core/kv_cache_manager.py", "    def allocate_slots("),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "        full_sequence_must_fit: bool = False,"),
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            '                "num_new_tokens must be greater than 0 when there are no "',
        ),
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            "            num_tokens_main_model + num_lookahead_tokens, self.max_model_len",
        ),
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            "            full_num_tokens = min(request.num_tokens, self.max_model_len)",
        ),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "            watermark_blocks = self.watermark_blocks"),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "        self.coordinator.remove_skipped_blocks("),
    ],
    [
        ("nanoengine/core/kv_cache_manager.py", "    def allocate_slots(", 2),
        ("nanoengine/core/kv_cache_manager.py", "        full_sequence_must_fit: bool = False,", 2),
        ("nanoengine/core/kv_cache_manager.py", "    def _check_allocation("),
        (
            "nanoengine/core/kv_cache_manager.py",
            '                f"new_computed_blocks must be the KVCacheBlocks that get_computed_blocks returned, got a "',
        ),
        (
            "nanoengine/core/kv_cache_manager.py",
            "        num_tokens_need_slot = num_computed + num_new_tokens + num_lookahead_tokens\n        if not self._fits(",
        ),
    ],
)
R(
    "06",
    "FullAttentionManager.find_longest_cache_hit and get_num_blocks_to_allocate",
    [
        ("vllm/vllm/v1/core/single_type_kv_cache_manager.py", "class FullAttentionManager(SingleTypeKVCacheManager):"),
        (
            "vllm/vllm/v1/core/single_type_kv_cache_manager.py",
            "    @classmethod\n    def find_longest_cache_hit(\n        cls,\n        block_hashes: BlockHashList,\n        max_length: int,\n        kv_cache_group_ids: list[int],\n        block_pool: BlockPool,\n        kv_cache_spec: KVCacheSpec,\n        drop_eagle_block: bool,\n        alignment_tokens: int,\n        dcp_world_size: int = 1,\n        pcp_world_size: int = 1,\n    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:",
        ),
        (
            "vllm/vllm/v1/core/single_type_kv_cache_manager.py",
            "        # Phase 2 (fine-grained only): extend into the first non-full block by",
        ),
        (
            "vllm/vllm/v1/core/single_type_kv_cache_manager.py",
            "        total_computed_tokens: int,\n        num_local_computed_tokens: int,\n        num_tokens_main_model: int,\n        apply_admission_cap: bool = False,\n        prefill_end: int = 0,",
        ),
        (
            "vllm/vllm/v1/core/single_type_kv_cache_manager.py",
            "        num_evictable_blocks = self._get_num_evictable_blocks(",
        ),
    ],
    [
        (
            "nanoengine/core/single_type_kv_cache_manager.py",
            "class FullAttentionManager(SingleTypeKVCacheManager):\n    def find_longest_cache_hit(\n        self,\n        block_hashes: list[BlockHash],\n        max_length: int,\n        group_ids: list[int],\n        token_ids: Sequence[int] | None = None,",
        ),
        (
            "nanoengine/core/single_type_kv_cache_manager.py",
            "    def get_num_blocks_to_allocate(\n        self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock], num_computed_tokens: int\n    ) -> int:",
        ),
        ("nanoengine/core/kv_cache_coordinator.py", "        return hits, len(hits[0]) * self.block_size"),
    ],
)
R(
    "06",
    "BlockPool.get_cached_block",
    [
        ("vllm/vllm/v1/core/block_pool.py", "        self, block_hash: BlockHash, kv_cache_group_ids: list[int]"),
        ("vllm/vllm/v1/core/block_pool.py", "    ) -> list[KVCacheBlock] | None:"),
    ],
    [
        ("nanoengine/core/block_pool.py", "    def get_cached_block(", 2),
        (
            "nanoengine/core/block_pool.py",
            "        token_ids: Sequence[int] | None = None,\n        kv_cache_group_id: int = 0,\n    ) -> KVCacheBlock | None:",
        ),
        (
            "nanoengine/core/single_type_kv_cache_manager.py",
            "    def get_cached_blocks(\n        self, block_hash: BlockHash, group_ids: list[int], token_ids: Sequence[int] | None = None\n    )",
        ),
    ],
)
R(
    "06",
    "map key and BlockHashToBlockMap",
    [
        ("vllm/vllm/v1/core/kv_cache_utils.py", "def make_block_hash_with_group_id("),
        (
            "vllm/vllm/v1/core/kv_cache_utils.py",
            '    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "big", signed=False))',
        ),
        ("vllm/vllm/v1/core/block_pool.py", "            block_hash_with_group_id = make_block_hash_with_group_id("),
        ("vllm/vllm/v1/core/block_pool.py", "            self._cache[key] = block"),
        ("vllm/vllm/v1/core/block_pool.py", "    NOTE #2: The union type is introduced in order to reduce GC costs"),
    ],
    [
        ("nanoengine/core/block_pool.py", "            self._cache[block_hash] = {block.block_id: block}"),
        (
            "nanoengine/core/kv_cache_utils.py",
            '    if kv_cache_group_id == 0:\n        return block_hash\n    return BlockHash(block_hash + kv_cache_group_id.to_bytes(4, "big"))',
        ),
    ],
)
R(
    "06",
    "free_blocks checks and stated reasons",
    [
        (
            "vllm/vllm/v1/core/block_pool.py",
            "    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:",
        ),
        ("vllm/vllm/v1/core/block_pool.py", "            block.ref_cnt -= 1", 2),
        ("vllm/vllm/v1/core/block_pool.py", "# LIFO reuse of non-cached blocks for better GPU locality."),
        ("vllm/vllm/v1/core/block_pool.py", "# FIFO reuse of cached blocks for LRU eviction behavior."),
    ],
    [
        (
            "nanoengine/core/block_pool.py",
            '                    f"Double free: block {block.block_id} has no reference left "',
        )
    ],
)
R(
    "14",
    "skip_reading_prefix_cache",
    [
        ("vllm/vllm/sampling_params.py", "    skip_reading_prefix_cache: bool | None = None"),
        ("vllm/vllm/sampling_params.py", "        if self.skip_reading_prefix_cache is None:"),
        ("vllm/vllm/v1/request.py", "    def get_skip_reading_prefix_cache(self) -> bool:"),
    ],
    [("nanoengine/request.py", "    def skip_reading_prefix_cache(self) -> bool:")],
)

# 07
R(
    "07",
    "Scheduler constructor",
    [
        ("vllm/vllm/v1/core/sched/scheduler.py", "class Scheduler(SchedulerInterface):"),
        ("vllm/vllm/v1/core/sched/scheduler.py", "        self.kv_cache_manager = KVCacheManager("),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:",
        ),
    ],
    [
        (
            "nanoengine/core/sched/scheduler.py",
            "    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManagerInterface) -> None:",
        ),
        (
            "nanoengine/core/sched/scheduler.py",
            "    def from_config(cls, config: EngineConfig, kv_cache_config: KVCacheConfig) -> Self:",
        ),
        ("nanoengine/core/sched/scheduler.py", "        return cls(config.scheduler_config, manager)"),
        ("nanoengine/core/sched/scheduler.py", "    def schedule(self) -> SchedulerOutput:"),
    ],
)
R(
    "07",
    "budget defaults",
    [
        ("vllm/vllm/config/scheduler.py", "    DEFAULT_MAX_NUM_BATCHED_TOKENS: ClassVar[int] = 2048"),
        ("vllm/vllm/config/scheduler.py", "    DEFAULT_MAX_NUM_SEQS: ClassVar[int] = 128"),
        ("vllm/vllm/config/scheduler.py", "    The default value here is mainly for convenience when testing."),
        ("vllm/vllm/engine/arg_utils.py", "    def get_batch_defaults("),
        ("vllm/vllm/engine/arg_utils.py", "                UsageContext.LLM_CLASS: 16384,"),
        ("vllm/vllm/engine/arg_utils.py", "                UsageContext.LLM_CLASS: 4096 * world_size,"),
        ("vllm/vllm/config/scheduler.py", "    max_num_scheduled_tokens: int | None"),
        ("vllm/vllm/config/scheduler.py", "    max_num_active_seqs: int | None"),
        ("vllm/vllm/v1/core/sched/scheduler.py", "        token_budget = self.max_num_scheduled_tokens"),
    ],
    [
        ("nanoengine/config/scheduler.py", "@dataclass(slots=True, kw_only=True)\nclass SchedulerConfig:"),
        ("nanoengine/config/scheduler.py", "    max_num_batched_tokens: int = 2048"),
        ("nanoengine/config/scheduler.py", "    max_num_seqs: int = 64"),
    ],
)
R(
    "07",
    "lone request out of blocks",
    [
        ("vllm/vllm/v1/core/sched/scheduler.py", "                        preempted_req = self.running[-1]"),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                    if preempted_req == request:"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                    # preempted itself. The requests after it have higher",
        ),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                    if not self._request_blocks_can_be_freed(preempted_req):",
        ),
    ],
    [
        ("nanoengine/core/sched/scheduler.py", "                    self.finish_length_capped(request)"),
        (
            "nanoengine/core/sched/scheduler.py",
            "                if self.policy is SchedulingPolicy.PRIORITY and request.status is RequestStatus.PREEMPTED:",
        ),
        ("nanoengine/core/sched/scheduler.py", "    def finish_length_capped("),
    ],
)
R(
    "07",
    "where num_computed_tokens advances",
    [
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "            request.num_in_flight_tokens += num_scheduled_token"),
        ("vllm/vllm/v1/core/sched/scheduler.py", "        self.reset_preempted_req_ids = set()"),
    ],
    [
        ("nanoengine/core/sched/scheduler.py", "            request.num_computed_tokens += n"),
        (
            "nanoengine/core/sched/scheduler.py",
            "                request.num_computed_tokens < request.num_tokens + request.num_output_placeholders",
        ),
    ],
)
R(
    "07",
    "resumed requests in SchedulerOutput",
    [
        ("vllm/vllm/v1/core/sched/scheduler.py", "            scheduled_new_reqs.extend(scheduled_resumed_reqs)"),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                    req._all_token_ids,"),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                resumed_req_ids.add(req_id)"),
        ("vllm/vllm/v1/core/sched/output.py", "    # Only used for v2 model runner.", 2),
        ("vllm/vllm/config/vllm.py", "        use_v2_model_runner = envs.VLLM_USE_V2_MODEL_RUNNER"),
    ],
    [
        ("nanoengine/core/sched/output.py", "            prefill_token_ids=list(request.all_token_ids),"),
        (
            "nanoengine/worker/model_runner.py",
            "        self.remove_requests(so.preempted_req_ids, keep_generators=True)",
        ),
    ],
)
R(
    "07",
    "CachedRequestData fields",
    [
        ("vllm/vllm/v1/core/sched/output.py", "class CachedRequestData:"),
        (
            "vllm/vllm/v1/core/sched/output.py",
            "    # NOTE(woosuk): new_token_ids is only used for pipeline parallelism.",
        ),
        ("vllm/vllm/v1/core/sched/output.py", "    # MRV1-only: For requests not scheduled in the last step"),
        ("vllm/vllm/v1/core/sched/output.py", "    new_block_ids: list[tuple[list[int], ...] | None]"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                req_to_new_blocks[req_id].get_block_ids(allow_none=True)",
        ),
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            "        if allow_none and all(len(group) == 0 for group in groups):",
        ),
    ],
    [
        ("nanoengine/core/sched/output.py", "class CachedRequestData:"),
        (
            "nanoengine/core/sched/output.py",
            "    new_block_ids: list[tuple[list[int], ...]] = field(default_factory=list)",
        ),
        ("nanoengine/core/sched/scheduler.py", "            new_blocks[request.request_id] = blocks.get_block_ids()"),
    ],
)
R(
    "07",
    "two waiting queues",
    [
        ("vllm/vllm/v1/core/sched/scheduler.py", "        self.kv_holding_waiting = create_request_queue(self.policy)"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "a block-holder must never sit behind a request whose\n        # failed allocation would stop the scheduling scan.",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                request_queue = self.kv_holding_waiting"),
        ("vllm/vllm/v1/core/sched/scheduler.py", "    def _holds_kv_blocks(request: Request) -> bool:"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "            or request.status == RequestStatus.WAITING_FOR_REMOTE_KVS",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "    def _enqueue_waiting_request(self, request: Request) -> None:"),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                if self._holds_kv_blocks(request_to_skip):"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "        # Put the request back to the waiting queue.\n        self.waiting.prepend_request(request)",
        ),
    ],
    [
        (
            "nanoengine/core/sched/scheduler.py",
            "        self.waiting: RequestQueue = create_request_queue(self.policy)",
        ),
        ("nanoengine/core/sched/scheduler.py", "            request = self.waiting.peek_request()"),
    ],
)
R(
    "07",
    "skipped requests go back in front",
    [
        ("vllm/vllm/v1/core/sched/scheduler.py", "            def skip_request(from_queue: RequestQueue) -> None:"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                    step_skipped_kv_holding.appendleft(request_to_skip)",
        ),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                    step_skipped_waiting.appendleft(request_to_skip)",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                self.waiting.prepend_requests(step_skipped_waiting)"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                if request.num_stale_output_tokens and not request.drop_stale_output:",
        ),
        ("vllm/vllm/v1/core/sched/request_queue.py", "        self.extendleft(requests)"),
        (
            "vllm/vllm/v1/core/sched/request_queue.py",
            '        front. Requests are ordered by (priority, arrival_time)."""\n        for request in requests:',
        ),
    ],
    [
        ("nanoengine/core/sched/scheduler.py", "            if request.num_stale_output_tokens:"),
        ("nanoengine/core/sched/scheduler.py", "                skipped.append(self.waiting.pop_request())"),
        (
            "nanoengine/core/sched/scheduler.py",
            "        for request in reversed(skipped):  # back at the front, in their order",
        ),
        (
            "nanoengine/engine/llm_engine.py",
            "            if len(batch_queue) < 2 and self.scheduler.has_unfinished_requests():",
        ),
        (
            "tests/engine/test_scheduler.py",
            "def test_requests_skipped_for_stale_output_go_back_in_front_in_their_order_and_do_not_block_the_rest():",
        ),
    ],
)
R(
    "07",
    "why vLLM skips a waiting request",
    [
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                ready_to_schedule = self._handle_blocked_waiting_request(request)",
        ),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "        elif request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:",
        ),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "        elif request.status == RequestStatus.WAITING_FOR_STREAMING_REQ:",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                    # Scheduling would exceed max_loras, skip."),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                        if ext_tokens is None:"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                    if self._ec_transfer_pending(request, ec_computed_tokens):",
        ),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                    num_new_tokens = self._reserve_prefill_lookahead(",
        ),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                    if num_new_tokens == 0:\n                        # The request cannot be scheduled. Requeue it",
        ),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                    self._set_kv_fetch_stage(request, KV_FETCH_IN_PROGRESS)\n                    skip_request(",
        ),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                        drop_stale_output=self.requires_kv_delivery,",
        ),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                self._preempt_request(request, timestamp, drop_stale_output=True)",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "        request.drop_stale_output = True"),
    ],
    [
        ("nanoengine/entrypoints/llm.py", '    "lora_request": "nanoengine serves no LoRA adapters.",'),
        ("nanoengine/entrypoints/llm.py", '    "mm_processor_kwargs": "nanoengine serves text-only models.",'),
        ("nanoengine/sampling_params.py", '    "structured_outputs": ((None,), "nanoengine has no grammar-constrained'),
    ],
)
R(
    "07",
    "deferred_waiting counts skipped requests",
    [
        ("vllm/vllm/v1/core/sched/scheduler.py", "        self.deferred_waiting: set[Request] = set()"),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                self.deferred_waiting.add(request_to_skip)"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "        if self._is_blocked_waiting_status(request.status):\n            self.deferred_waiting.add(request)",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                self.deferred_waiting.discard(request)"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "            self.deferred_waiting.difference_update(waiting_requests_to_remove)",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "            num_waiting_reqs=num_waiting - num_deferred,"),
        ("vllm/vllm/v1/core/sched/scheduler.py", "            num_skipped_waiting_reqs=num_deferred,"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                self.prefill_capacity_bound = num_waiting > len(self.deferred_waiting)",
        ),
        (
            "vllm/vllm/v1/metrics/loggers.py",
            "                scheduler_stats.num_waiting_reqs\n                + scheduler_stats.num_skipped_waiting_reqs",
        ),
    ],
    [
        ("nanoengine/metrics/stats.py", "    num_waiting_reqs: int = 0"),
        ("nanoengine/engine/async_llm.py", "            len(scheduler.waiting),"),
    ],
)

# 08
R(
    "08",
    "how the engine is built",
    [
        ("vllm/vllm/entrypoints/llm.py", "        engine_args = EngineArgs("),
        ("vllm/vllm/entrypoints/llm.py", "        self.llm_engine = LLMEngine.from_engine_args("),
        ("vllm/vllm/v1/engine/llm_engine.py", "        vllm_config = engine_args.create_engine_config(usage_context)"),
        ("vllm/vllm/config/vllm.py", "class VllmConfig:"),
        ("vllm/vllm/v1/engine/core.py", "        self.model_executor = executor_class(vllm_config)"),
        ("vllm/vllm/v1/executor/uniproc_executor.py", "            self.driver_worker.load_model()"),
        ("vllm/vllm/v1/worker/gpu_worker.py", "    def load_model(self, *, load_dummy_weights: bool = False) -> None:"),
        ("vllm/vllm/v1/engine/core.py", "        kv_cache_config = self._initialize_kv_caches(vllm_config)"),
        (
            "vllm/vllm/v1/engine/core.py",
            "                available_gpu_memory = self.model_executor.determine_available_memory()",
        ),
        ("vllm/vllm/v1/engine/core.py", "        kv_cache_configs = get_kv_cache_configs("),
        ("vllm/vllm/v1/engine/core.py", "        self.model_executor.initialize_from_config(kv_cache_configs)"),
        (
            "vllm/vllm/v1/worker/gpu_worker.py",
            "    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:",
        ),
        ("vllm/vllm/v1/engine/core.py", "        self.scheduler: SchedulerInterface = Scheduler("),
        ("vllm/vllm/v1/core/sched/scheduler.py", "        self.kv_cache_manager = KVCacheManager("),
        ("vllm/vllm/v1/engine/llm_engine.py", "        if envs.VLLM_ENABLE_V1_MULTIPROCESSING:"),
    ],
    [
        (
            "nanoengine/entrypoints/llm.py",
            "        self.engine = LLMEngine.from_engine_args(EngineArgs.from_kwargs(model, kwargs))",
        ),
        ("nanoengine/engine/llm_engine.py", "        return cls.from_config(engine_args.create_engine_config())"),
        ("nanoengine/engine/arg_utils.py", "    def create_engine_config(self) -> EngineConfig:"),
        ("nanoengine/config/engine.py", "class EngineConfig:"),
        (
            "nanoengine/config/engine.py",
            "    cache_config: CacheConfig\n    scheduler_config: SchedulerConfig\n    parts: EngineParts",
        ),
        (
            "nanoengine/engine/llm_engine.py",
            "        worker = Worker(config)\n        kv_cache_config = worker.get_kv_cache_config()",
        ),
        ("nanoengine/engine/llm_engine.py", "        runner = worker.initialize_from_config(kv_cache_config)"),
        (
            "nanoengine/worker/worker.py",
            "            self.model = load_model(mc.folder, mc.hf_config, mc.device, mc.dtype, mc.quantization)",
        ),
        ("nanoengine/engine/llm_engine.py", "            lambda *args: scheduler_cls.from_config(*args),"),
        (
            "nanoengine/worker/worker.py",
            "vLLM's worker runs in a process of its own per GPU; nanoengine's is an object in the engine's process.",
        ),
    ],
)
R(
    "08",
    "LLMEngine.add_request",
    [
        ("vllm/vllm/v1/engine/llm_engine.py", "    def add_request("),
        ("vllm/vllm/v1/engine/llm_engine.py", "        request_id: str,"),
    ],
    [
        (
            "nanoengine/engine/llm_engine.py",
            "    def add_request(\n        self,\n        prompt_token_ids: list[int],\n        params: SamplingParams,\n        prompt: str | None = None,\n        priority: int = 0,\n        cache_salt: str | None = None,\n    ) -> str:",
        )
    ],
)
R(
    "08",
    "step",
    [
        ("vllm/vllm/v1/engine/llm_engine.py", "    def step(self) -> list[RequestOutput | PoolingRequestOutput]:"),
        ("vllm/vllm/entrypoints/common/offline.py", "                if output.finished:"),
        (
            "vllm/vllm/v1/engine/core.py",
            "        future = self.model_executor.execute_model(scheduler_output, non_block=True)",
        ),
        (
            "vllm/vllm/v1/engine/core.py",
            "                model_output = self.model_executor.sample_tokens(grammar_output)",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "    ) -> dict[int, EngineCoreOutputs]:"),
        ("vllm/vllm/v1/engine/core.py", "    def step_with_batch_queue("),
    ],
    [
        ("nanoengine/engine/llm_engine.py", "    def step(self) -> list[RequestOutput]:"),
        ("nanoengine/engine/llm_engine.py", "        return self._process(so, self.runner.execute_model(so), start)"),
        (
            "nanoengine/engine/llm_engine.py",
            "            batch_queue.appendleft((self._executor.submit(self.runner.execute_model, so), so))",
        ),
    ],
)
R(
    "08",
    "ModelRunnerOutput",
    [
        ("vllm/vllm/v1/outputs.py", "class ModelRunnerOutput:"),
        ("vllm/vllm/v1/outputs.py", "    sampled_token_ids: list[list[int]]"),
        ("vllm/vllm/v1/outputs.py", "    # each request due to speculative/jump decoding."),
    ],
    [("nanoengine/worker/outputs.py", "    sampled_token_ids: dict[str, list[int]]")],
)
R(
    "08",
    "stats and hit rate",
    [
        ("vllm/vllm/entrypoints/llm.py", '    def get_metrics(self) -> list["Metric"]:'),
        ("vllm/vllm/v1/metrics/loggers.py", '            name="vllm:prefix_cache_queries",'),
        ("vllm/vllm/v1/metrics/loggers.py", '            name="vllm:prefix_cache_hits",'),
        ("vllm/vllm/v1/metrics/stats.py", "class PrefixCacheStats(BaseCacheStats):"),
        ("vllm/vllm/v1/metrics/stats.py", "    def __init__(self, max_recent_requests: int = 1000) -> None:"),
        ("vllm/vllm/v1/metrics/stats.py", "    def hit_rate(self) -> float:"),
        ("vllm/vllm/v1/metrics/stats.py", "        if stats.reset:"),
    ],
    [
        ("nanoengine/engine/llm_engine.py", "class EngineStats:"),
        ("nanoengine/core/kv_cache_manager.py", "    def hit_rate(self) -> float:"),
        ("nanoengine/entrypoints/llm.py", "    def get_stats(self) -> EngineStats:"),
    ],
)
R(
    "08",
    "num_cached_tokens",
    [
        ("vllm/vllm/v1/metrics/stats.py", "class PrefillStats:"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                    if request.prefill_stats and request.num_preemptions <= 0:",
        ),
        (
            "vllm/vllm/v1/engine/output_processor.py",
            "                        engine_core_output.prefill_stats.num_cached_tokens",
        ),
    ],
    [
        ("nanoengine/request.py", "    num_cached_tokens: int = -1"),
        ("nanoengine/core/sched/scheduler.py", "            request.num_cached_tokens = num_computed_tokens"),
    ],
)
R(
    "08",
    "metrics timestamps",
    [
        ("vllm/vllm/outputs.py", "        metrics: RequestStateStats | None = None,"),
        ("vllm/vllm/v1/metrics/stats.py", "class RequestStateStats:"),
        ("vllm/vllm/v1/metrics/stats.py", "    first_token_ts: float = 0.0"),
    ],
    [("nanoengine/outputs.py", "class RequestMetrics:")],
)

# 09
R(
    "09",
    "no block_pool hook",
    [
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "        self.block_pool = BlockPool("),
        ("vllm/vllm/v1/core/block_pool.py", "        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)"),
    ],
    [
        (
            "nanoengine/core/sched/scheduler.py",
            '            pool = build_part(\n                "block_pool",\n                parts.block_pool,',
        ),
        ("nanocourse/policies/eviction.py", "class FrequencyAwareBlockPool"),
    ],
)
R(
    "09",
    "event classes",
    [
        ("vllm/vllm/distributed/kv_events.py", "class BlockStored(KVCacheEvent):"),
        ("vllm/vllm/distributed/kv_events.py", "    group_idx: int | None = None"),
        ("vllm/vllm/distributed/kv_events.py", "class BlockRemoved(KVCacheEvent):"),
        ("vllm/vllm/v1/core/block_pool.py", "                new_hashes.append(maybe_convert_block_hash(block_hash))"),
        (
            "vllm/vllm/v1/core/block_pool.py",
            "                    block_hashes=[maybe_convert_block_hash(get_block_hash(block_hash))],",
        ),
        (
            "vllm/vllm/v1/core/kv_cache_utils.py",
            '    return int.from_bytes(hash_bytes, byteorder="big") & ((1 << 64) - 1)',
        ),
    ],
    [
        ("nanoengine/core/kv_events.py", "class BlockStored(KVCacheEvent):"),
        (
            "nanoengine/core/block_pool.py",
            "        new_hashes = [make_block_hash_with_group_id(h, kv_cache_group_id) for h in new_hashes]",
        ),
        ("nanoengine/core/kv_cache_utils.py", "    if kv_cache_group_id == 0:"),
    ],
)
R(
    "09",
    "event delivery",
    [
        ("vllm/vllm/config/kv_events.py", "    enable_kv_cache_events: bool = False"),
        ("vllm/vllm/config/kv_events.py", '    endpoint: str = "tcp://*:5557"'),
        ("vllm/vllm/distributed/kv_events.py", "class KVEventBatch(EventBatch):"),
        ("vllm/vllm/v1/core/block_pool.py", "        if not self.enable_kv_cache_events:\n            return []"),
    ],
    [("nanoengine/core/block_pool.py", "    def take_events(self) -> list[KVCacheEvent]:", 2)],
)
R(
    "09",
    "cache_salt in the prompt",
    [
        ("vllm/vllm/inputs/llm.py", "class _PromptOptions(TypedDict):"),
        ("vllm/vllm/inputs/llm.py", "    cache_salt: NotRequired[str]"),
        ("vllm/vllm/entrypoints/llm.py", "    def generate("),
        ("vllm/vllm/entrypoints/openai/chat_completion/protocol.py", "    cache_salt: str | None = Field("),
    ],
    [
        ("nanoengine/entrypoints/llm.py", "        cache_salt: str | None = None,"),
        (
            "nanoengine/engine/llm_engine.py",
            "        priority: int = 0,\n        cache_salt: str | None = None,\n    ) -> str:",
        ),
    ],
)
R(
    "14",
    "num_common_prefix_blocks",
    [
        (
            "vllm/vllm/v1/core/sched/output.py",
            "    # Deprecated: cascade attention has been removed, so this is always empty.",
        ),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "        return [0] * self.num_kv_cache_groups"),
    ],
    [
        (
            "nanoengine/worker/model_runner.py",
            "                    num_common_prefix_blocks=0\n                    if group.sliding_window\n                    else num_common_prefix_blocks(tables[:num_decodes]),",
        ),
        (
            "nanoengine/worker/model_runner.py",
            "def num_common_prefix_blocks(tables: list[list[int]]) -> int:",
        ),
        ("nanoengine/attention/backend.py", "    def _cascade_decode("),
    ],
)

# 10
R(
    "10",
    "scheduler_cls and constructor",
    [
        ("vllm/vllm/config/scheduler.py", "    scheduler_cls: str | type[object] | None = None"),
        ("vllm/vllm/v1/engine/core.py", "        Scheduler = vllm_config.scheduler_config.get_scheduler_cls()"),
        ("vllm/vllm/v1/engine/core.py", "        self.scheduler: SchedulerInterface = Scheduler("),
    ],
    [
        ("nanoengine/engine/llm_engine.py", "            lambda *args: scheduler_cls.from_config(*args),"),
        (
            "nanoengine/core/sched/scheduler.py",
            "    def from_config(cls, config: EngineConfig, kv_cache_config: KVCacheConfig) -> Self:",
        ),
        (
            "nanoengine/core/sched/scheduler.py",
            '        manager = build_part(\n            parts.named("kv_cache_manager_cls"),',
        ),
        ("nanoengine/core/sched/scheduler.py", "        return cls(config.scheduler_config, manager)"),
    ],
)
R(
    "10",
    "SchedulerInterface",
    [
        ("vllm/vllm/v1/core/sched/interface.py", "class SchedulerInterface(ABC):"),
        ("vllm/vllm/v1/core/sched/interface.py", "    def schedule(self, throttle_prefills: bool = False)"),
        ("vllm/vllm/v1/core/sched/interface.py", "    def shutdown(self) -> None:"),
        ("vllm/vllm/v1/core/sched/interface.py", "    @abstractmethod\n    def __init__("),
        (
            "vllm/vllm/v1/core/sched/interface.py",
            '    def update_draft_token_ids(self, draft_token_ids: "DraftTokenIds") -> None:',
        ),
    ],
    [
        ("nanoengine/core/sched/interface.py", "class SchedulerInterface(Protocol):"),
        (
            "nanoengine/core/sched/interface.py",
            "    @classmethod\n    def from_config(cls, config: EngineConfig, kv_cache_config: KVCacheConfig) -> Self: ...",
        ),
        (
            "nanoengine/core/sched/interface.py",
            "    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None: ...",
        ),
    ],
)
R(
    "10",
    "internal parts",
    [
        ("vllm/vllm/v1/core/sched/scheduler.py", "        self.kv_cache_manager = KVCacheManager("),
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "        self.block_pool = BlockPool("),
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "            get_manager_for_kv_cache_spec("),
        ("vllm/vllm/v1/core/block_pool.py", "        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)"),
        ("vllm/vllm/v1/worker/gpu_input_batch.py", "        self.block_table = MultiGroupBlockTable("),
    ],
    [
        ("nanoengine/parts.py", "class EngineParts:"),
        (
            "nanoengine/engine/arg_utils.py",
            '    "full_attention_manager_cls": FullAttentionManager,',
        ),
        ("nanoengine/core/sched/scheduler.py", "            pool = BlockPool("),
        (
            "nanoengine/core/kv_cache_coordinator.py",
            "            (full_attention_manager_cls if g.sliding_window is None else sliding_window_manager_cls)(",
        ),
        ("nanoengine/core/block_pool.py", "        free_queue_cls: type[FreeBlockQueue] = FreeKVCacheBlockQueue,"),
        (
            "nanoengine/worker/model_runner.py",
            "        self.input_block_table = MultiGroupBlockTable(self.block_size, len(kv_cache.groups), block_table_cls)",
        ),
    ],
)
R(
    "10",
    "attention backend",
    [
        ("vllm/vllm/config/attention.py", "    backend: AttentionBackendEnum | None = None"),
        (
            "vllm/vllm/engine/arg_utils.py",
            "    attention_backend: AttentionBackendEnum | None = AttentionConfig.backend",
        ),
        (
            "vllm/vllm/v1/attention/backends/registry.py",
            '    TRITON_ATTN = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"',
        ),
    ],
    [
        ("nanoengine/engine/arg_utils.py", "    attention_backend: Any = None"),
        ("nanoengine/engine/arg_utils.py", "            if missing := missing_members(backend, AttentionBackend):"),
        ("nanoengine/attention/backend.py", "class AttentionBackend(Protocol):"),
        ("nanoengine/attention/backend.py", "    name: str\n    supports_cuda_graphs: bool"),
    ],
)
R(
    "10",
    "hash algo",
    [
        (
            "vllm/vllm/config/cache.py",
            'PrefixCachingHashAlgo = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]',
        )
    ],
    [("nanoengine/engine/arg_utils.py", "    hash_block_tokens: Callable | None = None")],
)

# 11
R(
    "11",
    "cudagraph mode",
    [
        ("vllm/vllm/config/compilation.py", "    FULL_DECODE_ONLY = (FULL, NONE)"),
        ("vllm/vllm/config/compilation.py", "    - FULL_AND_PIECEWISE. (v1 default)"),
        ("vllm/vllm/config/vllm.py", '        "cudagraph_mode": CUDAGraphMode.FULL_AND_PIECEWISE,'),
        ("vllm/vllm/config/vllm.py", "    optimization_level: OptimizationLevel = OptimizationLevel.O2"),
        ("vllm/vllm/compilation/cuda_graph.py", "class CUDAGraphWrapper:"),
        ("vllm/vllm/v1/cudagraph_dispatcher.py", "class CudagraphDispatcher:"),
        ("vllm/vllm/v1/worker/gpu/cudagraph_utils.py", "class CudaGraphManager:"),
        ("vllm/vllm/config/model.py", "    NOTE: This disables both `torch.compile` and CUDA graphs"),
    ],
    [
        ("nanoengine/worker/cuda_graphs.py", "class DecodeGraphs:"),
        (
            "nanoengine/worker/worker.py",
            "    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> ModelRunner:",
        ),
        (
            "nanoengine/worker/worker.py",
            '        if (\n            not (config.model_config.enforce_eager or len(groups) > 1 or config.use_eagle)\n            and self.device.type == "cuda"\n            and self.backend.supports_cuda_graphs\n        ):',
        ),
    ],
)
R(
    "11",
    "capture sizes",
    [
        ("vllm/vllm/config/compilation.py", "        [1, 2, 4] + list(range(8, 256, 8)) + list("),
        (
            "vllm/vllm/config/compilation.py",
            "    If not specified, max_cudagraph_capture_size is capped at 512 by default,",
        ),
    ],
    [
        ("nanoengine/worker/cuda_graphs.py", "CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)"),
        (
            "nanoengine/worker/cuda_graphs.py",
            "        self.sizes = [s for s in CAPTURE_SIZES if s < max_num_seqs] + [max_num_seqs]",
        ),
    ],
)
R(
    "11",
    "backend graph support",
    [
        (
            "vllm/vllm/v1/attention/backends/triton_attn.py",
            "    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS",
        ),
        ("vllm/vllm/v1/attention/backend.py", "class AttentionCGSupport(Enum):"),
        ("vllm/vllm/v1/attention/backend.py", '    """Cudagraph always supported; supports mixed-prefill-decode"""'),
    ],
    [
        ("nanoengine/attention/triton_backend.py", "    supports_cuda_graphs = True"),
        ("nanoengine/attention/backend.py", "    supports_cuda_graphs: bool"),
        (
            "nanoengine/attention/backend.py",
            "    supports_cuda_graphs = False  # the gather's shapes follow each step's seq_lens",
        ),
        ("nanoengine/worker/worker.py", "            and self.backend.supports_cuda_graphs"),
    ],
)
R(
    "11",
    "padding and 3D threshold under graphs",
    [
        ("vllm/vllm/v1/attention/backends/utils.py", "PAD_SLOT_ID = -1"),
        (
            "vllm/vllm/v1/attention/backends/triton_attn.py",
            "            # Select the CUDA Graph capture size closest to self.seq_threshold_3D",
        ),
        ("vllm/vllm/v1/attention/backends/triton_attn.py", "            # correct execution path."),
    ],
    [
        ("nanoengine/worker/cuda_graphs.py", "        self.slot_mapping[n:size] = -1"),
        ("nanoengine/worker/cuda_graphs.py", "- The block table is max_model_len / block_size wide"),
    ],
)
R(
    "11",
    "dtype default",
    [
        ("vllm/vllm/config/model.py", '    dtype: ModelDType | torch.dtype = "auto"'),
        ("vllm/vllm/config/model.py", '    - "auto" will use FP16 precision for FP32 and FP16 models, and BF16'),
        ("vllm/vllm/platforms/cuda.py", "            # Pascal, Volta and Turing NVIDIA GPUs, BF16 is not supported"),
        ("vllm/vllm/config/model.py", "        preferred_dtype = supported_dtypes[0]"),
        ("vllm/vllm/config/model.py", "    if config_dtype == torch.float32:\n        config_dtype = preferred_dtype"),
        ("vllm/vllm/platforms/cuda.py", "            return [torch.bfloat16, torch.float16, torch.float32]"),
        ("vllm/vllm/platforms/cuda.py", '                    "Bfloat16 is only supported on GPUs "'),
    ],
    [
        (
            "nanoengine/engine/arg_utils.py",
            '            dtype = named or default_dtype(device)  # None and "auto" take the device\'s default',
        ),
        ("nanoengine/engine/arg_utils.py", "    return torch.bfloat16 if bf16_supported(device) else torch.float16"),
        (
            "nanoengine/engine/arg_utils.py",
            '                    f"dtype=torch.bfloat16 needs compute capability 8.0 (Ampere) or newer; this GPU has "',
        ),
    ],
)

# 12
R(
    "12",
    "KVCacheGroupSpec",
    [
        ("vllm/vllm/v1/kv_cache_interface.py", "class KVCacheGroupSpec:"),
        ("vllm/vllm/v1/kv_cache_interface.py", "    layer_names: list[str]"),
        ("vllm/vllm/v1/kv_cache_interface.py", "    is_eagle_group: bool = False"),
        ("vllm/vllm/v1/kv_cache_interface.py", "class SlidingWindowSpec(AttentionSpec):"),
        ("vllm/vllm/model_executor/models/llama.py", "            per_layer_sliding_window=sliding_window,"),
        (
            "vllm/vllm/model_executor/models/llama.py",
            '            is_sliding = layer_types[effective_layer_idx] == "sliding_attention"',
        ),
    ],
    [
        ("nanoengine/kv_cache_interface.py", "class KVCacheGroupSpec:"),
        ("nanoengine/kv_cache_interface.py", "    is_eagle_group: bool = False"),
    ],
)
R(
    "12",
    "group order",
    [
        ("vllm/vllm/v1/core/kv_cache_planning.py", "        same_type_layers[layer_spec].append(layer_name)"),
        ("vllm/vllm/v1/core/kv_cache_planning.py", "            grouped_layers.append(layers[i::num_groups])"),
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "        self.attention_groups.sort("),
        (
            "vllm/vllm/v1/core/kv_cache_coordinator.py",
            "            key=lambda g: not isinstance(g.spec, FullAttentionSpec)",
        ),
    ],
    [
        (
            "nanoengine/kv_cache_interface.py",
            "    for window in sorted(by_window, key=lambda w: (w is not None, w or 0)):",
        ),
        ("nanoengine/core/kv_cache_utils.py", "    if kv_cache_group_id == 0:\n        return block_hash"),
    ],
)
R(
    "12",
    "coordinator and its return",
    [
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "def get_kv_cache_coordinator("),
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "        return KVCacheCoordinatorNoPrefixCache("),
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "        return UnitaryKVCacheCoordinator("),
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "    return HybridKVCacheCoordinator("),
        (
            "vllm/vllm/v1/core/kv_cache_coordinator.py",
            "        is_simple_hybrid = len(self.attention_groups) == 2 and isinstance(",
        ),
        (
            "vllm/vllm/v1/core/kv_cache_coordinator.py",
            "        return cache_hit_blocks, hit_length, num_uncached_common_prefix_tokens",
        ),
        ("vllm/vllm/v1/core/kv_cache_manager.py", "        shared_prefix_boundary = ("),
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "    if not enable_caching:"),
        (
            "vllm/vllm/v1/core/kv_cache_utils.py",
            '    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "big", signed=False))',
        ),
    ],
    [
        ("nanoengine/core/kv_cache_manager.py", "        self.coordinator = get_kv_cache_coordinator("),
        ("nanoengine/core/kv_cache_coordinator.py", "def get_kv_cache_coordinator("),
        (
            "nanoengine/core/kv_cache_coordinator.py",
            "    cls = UnitaryKVCacheCoordinator if len(groups) == 1 else HybridKVCacheCoordinator",
        ),
        (
            "nanoengine/core/kv_cache_coordinator.py",
            "        self, block_hashes: list[BlockHash], max_length: int, token_ids: Sequence[int] | None = None\n    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:",
        ),
        ("nanoengine/core/kv_cache_utils.py", "    if kv_cache_group_id == 0:\n        return block_hash"),
    ],
)
R(
    "12",
    "EAGLE block drop and lookahead hashes",
    [
        ("vllm/vllm/config/speculative.py", "    def needs_eagle_block_drop(self) -> bool:"),
        ("vllm/vllm/config/speculative.py", '        """Whether draft KV at a position depends on the next token.'),
        (
            "vllm/vllm/config/speculative.py",
            "        return self.use_eagle() and not (self.use_dflash() or self.use_dspark())",
        ),
        (
            "vllm/vllm/config/speculative.py",
            "        return self.needs_eagle_block_drop() and not self.disable_eagle_block_drop",
        ),
        ("vllm/vllm/config/speculative.py", "    disable_lookahead_block_hashes: bool = False"),
        ("vllm/vllm/config/vllm.py", "    def num_hash_lookahead_tokens(self) -> int:"),
        ("vllm/vllm/config/vllm.py", "            or speculative_config.disable_lookahead_block_hashes"),
        ("vllm/vllm/config/vllm.py", "        return self.num_prefill_lookahead_tokens"),
        ("vllm/vllm/v1/core/kv_cache_utils.py", "        num_tokens = request.num_tokens - num_hash_lookahead_tokens"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "            # Lookahead hashes prove the boundary token, so EAGLE needs no drop.",
        ),
        (
            "vllm/vllm/v1/kv_cache_interface.py",
            "    is_draft: bool = field(default=False, kw_only=True, compare=False)",
        ),
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "            drop_eagle_block=0 in self.drop_eagle_group_ids,"),
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "                    eagle_margin = eagle_proof_margin("),
        (
            "vllm/vllm/v1/core/kv_cache_planning.py",
            "            group.is_eagle_group = not draft_layer_names.isdisjoint(group.layer_names)",
        ),
        ("vllm/vllm/v1/core/kv_cache_coordinator.py", "        if use_eagle and not self.eagle_group_ids:"),
        (
            "vllm/vllm/v1/core/kv_cache_coordinator.py",
            "                drop_eagle_block = use_eagle and idx not in eagle_verified",
        ),
        ("vllm/vllm/config/vllm.py", "            return self.num_speculative_tokens"),
    ],
    [
        (
            "nanoengine/core/kv_cache_coordinator.py",
            "        hits = self.single_type_managers[0].find_longest_cache_hit(block_hashes, max_length, [0], **tokens)",
        ),
        (
            "nanoengine/core/kv_cache_coordinator.py",
            "                limit = min(length + self.block_size, len(block_hashes) * self.block_size) if use_eagle else length",
        ),
        (
            "nanoengine/core/kv_cache_coordinator.py",
            "        return {group_id for group_id, g in enumerate(groups) if g.is_eagle_group} or set(range(len(groups)))",
        ),
        (
            "nanoengine/kv_cache_interface.py",
            "            groups.append(KVCacheGroupSpec(target, window, is_eagle_group=len(target) < len(dealt)))",
        ),
        (
            "nanoengine/config/engine.py",
            "        return tuple(kv_cache_groups(self.model_config.hf_config, draft_config))",
        ),
    ],
)
R(
    "12",
    "SlidingWindowManager.find_longest_cache_hit",
    [
        ("vllm/vllm/v1/core/single_type_kv_cache_manager.py", "class SlidingWindowManager(SingleTypeKVCacheManager):"),
        ("vllm/vllm/v1/core/single_type_kv_cache_manager.py", "    def _contiguous_blocks_for_hit("),
        ("vllm/vllm/v1/core/single_type_kv_cache_manager.py", "        blocks = cdiv(window_size - 1, block_size)"),
        ("vllm/vllm/v1/core/single_type_kv_cache_manager.py", "    def find_longest_cache_hit(", 3),
        (
            "vllm/vllm/v1/core/kv_cache_coordinator.py",
            "                drop_eagle_block = use_eagle and idx not in eagle_verified",
        ),
    ],
    [
        (
            "nanoengine/core/single_type_kv_cache_manager.py",
            '    ) -> tuple[list[KVCacheBlock], ...]:\n        """The longest hit a window can serve',
        ),
        ("nanoengine/core/single_type_kv_cache_manager.py", "        if self.use_eagle and hits[0]:", 2),
    ],
)
R(
    "12",
    "remove_skipped_blocks and skipped tokens",
    [
        ("vllm/vllm/v1/core/single_type_kv_cache_manager.py", "    def remove_skipped_blocks("),
        (
            "vllm/vllm/v1/core/kv_cache_manager.py",
            "            max(0, total_computed_tokens - request.num_in_flight_tokens),",
        ),
        (
            "vllm/vllm/v1/core/single_type_kv_cache_manager.py",
            "            num_computed_tokens - self.sliding_window + 1 - self.extra_retained_tokens,",
        ),
    ],
    [
        (
            "nanoengine/core/single_type_kv_cache_manager.py",
            "    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int)",
            2,
        ),
        (
            "nanoengine/core/single_type_kv_cache_manager.py",
            "        return max(0, num_computed_tokens - self.sliding_window + 1)",
        ),
    ],
)
R(
    "12",
    "sparse retention of sliding blocks",
    [
        ("vllm/vllm/v1/core/block_pool.py", "        block_mask: list[bool] | None = None,"),
        ("vllm/vllm/v1/core/single_type_kv_cache_manager.py", "        block_mask = self.reachable_block_mask("),
        ("vllm/vllm/v1/core/single_type_kv_cache_manager.py", "    def reachable_block_mask(", 2),
        ("vllm/vllm/config/cache.py", "    prefix_cache_retention_interval: int | None = Field(default=0, ge=0)"),
    ],
    [
        ("nanoengine/core/single_type_kv_cache_manager.py", "        mask = self.reachable_block_mask("),
        ("nanoengine/core/single_type_kv_cache_manager.py", "    def reachable_block_mask(", 2),
        ("nanoengine/core/kv_cache_manager.py", "        prefix_cache_retention_interval: int | None = 0,"),
    ],
)
R(
    "12",
    "runner tables under a window",
    [
        ("vllm/vllm/v1/worker/gpu/block_table.py", "    def gather_block_tables("),
        (
            "vllm/vllm/v1/worker/gpu/block_table.py",
            "        tile that straddles the window start: masked-out NaN in such a tile",
        ),
        (
            "vllm/vllm/v1/worker/gpu/model_runner.py",
            "            num_computed_tokens=self.req_states.num_computed_tokens.gpu,",
        ),
        ("vllm/vllm/v1/kv_cache_interface.py", "    def num_retained_tokens(self) -> int:"),
    ],
    [
        ("nanoengine/worker/block_table.py", "    def append_row(self, req_id: str, block_ids: list[int]) -> None:", 2),
        ("nanoengine/attention/triton_kernels.py", "            n_mask = n_mask & (n >= lo)"),
        ("nanoengine/attention/triton_kernels.py", "    for start in range(lo // BLOCK_N * BLOCK_N, end, BLOCK_N):"),
    ],
)
R(
    "14",
    "parallel sampling",
    [
        ("vllm/vllm/v1/engine/parallel_sampling.py", "class ParentRequest:"),
        ("vllm/vllm/v1/engine/parallel_sampling.py", '        child_req_id = f"{index}_{self.request_id}"'),
        ("vllm/vllm/v1/engine/parallel_sampling.py", "            child_sampling_params.seed = seed + index"),
    ],
    [
        ("nanoengine/sampling_params.py", "    def child(self, index: int) -> SamplingParams:"),
        (
            "nanoengine/entrypoints/llm.py",
            "            return [merge_samples([call.done[i] for i in children]) for children in ids]",
        ),
    ],
)
R(
    "14",
    "reset_prefix_cache",
    [
        (
            "vllm/vllm/entrypoints/llm.py",
            "        self, reset_running_requests: bool = False, reset_connector: bool = False",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "    def reset_prefix_cache("),
    ],
    [("nanoengine/entrypoints/llm.py", "    def reset_prefix_cache(self) -> bool:")],
)

# 13
R(
    "13",
    "n-gram proposer",
    [
        ("vllm/vllm/v1/spec_decode/ngram_proposer.py", "class NgramProposer:"),
        ("vllm/vllm/v1/spec_decode/ngram_proposer.py", "    def batch_propose("),
        ("vllm/vllm/v1/spec_decode/ngram_proposer.py", "def batch_propose_numba("),
        ("vllm/vllm/v1/spec_decode/ngram_proposer.py", "def _find_longest_matched_ngram_and_propose_tokens("),
        ("vllm/vllm/v1/worker/gpu/spec_decode/ngram/speculator.py", "class NgramGPUSpeculator(BaseSpeculator):"),
        (
            "vllm/vllm/v1/worker/gpu/spec_decode/ngram/speculator.py",
            "        # Pack (n, pos) so a single max yields longest-n, rightmost-pos.",
        ),
        (
            "vllm/vllm/v1/worker/gpu/spec_decode/ngram/speculator.py",
            "    out = tl.where(slot_valid, gathered, last_tok)",
        ),
        # The runner picks the proposer: V2 always the GPU speculator; V1 the CPU one, and V1 then turns async off.
        ("vllm/vllm/v1/worker/gpu/spec_decode/__init__.py", "    elif speculative_config.use_ngram():"),
        ("vllm/vllm/v1/worker/gpu_model_runner.py", "                self.drafter = NgramProposer(self.vllm_config)"),
        ("vllm/vllm/config/vllm.py", "        # Async scheduling incompatibilities specific to the V1 model runner."),
        ("vllm/vllm/config/speculative.py", 'NgramGPUTypes = Literal["ngram_gpu"]'),
    ],
    [
        ("nanoengine/spec_decode/ngram_proposer.py", "class NgramProposer:"),
        ("nanoengine/spec_decode/ngram_proposer.py", "def find_longest_matched_ngram_and_propose_tokens("),
    ],
)
R(
    "13",
    "rejection sampler",
    [
        ("vllm/vllm/v1/worker/gpu/spec_decode/rejection_sampler.py", "class RejectionSampler:"),
        (
            "vllm/vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
            "accepted = target_logprob > tl.log(u) + draft_logprob",
        ),
        ("vllm/vllm/v1/sample/rejection_sampler.py", "class RejectionSampler(nn.Module):"),
        ("vllm/vllm/v1/sample/rejection_sampler.py", "PLACEHOLDER_TOKEN_ID: tl.constexpr = -1"),
        ("vllm/vllm/v1/sample/rejection_sampler.py", "    def parse_output("),
    ],
    [
        ("nanoengine/sample/rejection_sampler.py", "def rejection_sample(\n    logits: torch.Tensor,"),
        ("nanoengine/sample/rejection_sampler.py", "if float(torch.rand((), generator=gen)) < float(probs[draft]):"),
    ],
)
R(
    "13",
    "scheduler: drafts and rollback",
    [
        ("vllm/vllm/v1/core/sched/scheduler.py", "            # Speculative decode related."),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                num_rejected = num_draft_tokens - num_accepted"),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                        request.num_output_placeholders -= num_rejected",
        ),
    ],
    [
        (
            "nanoengine/core/sched/scheduler.py",
            "    def scheduled_spec_decode_tokens(self, num_scheduled: dict[str, int]) -> dict[str, list[int]]:",
        ),
        (
            "nanoengine/core/sched/scheduler.py",
            "    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:",
        ),
        (
            "nanoengine/core/sched/scheduler.py",
            "        num_rejected = len(spec_token_ids) - (len(new_token_ids) - 1) if spec_token_ids else 0",
        ),
    ],
)
R(
    "13",
    "the input budget and the drafting slots",
    [
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "        draft_slots = spec.max_num_new_slots_for_drafting if spec is not None else 0",
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "            input_budget -= num_new_tokens + draft_slots"),
        ("vllm/vllm/config/speculative.py", "    def max_num_new_slots_for_drafting(self) -> int:"),
        (
            "vllm/vllm/config/speculative.py",
            "            # The autoregressive draft-model input retains one unsliced token.",
        ),
    ],
    [
        ("nanoengine/config/speculative.py", "    def max_num_new_slots_for_drafting(self) -> int:"),
        ("nanoengine/core/sched/scheduler.py", "            budget -= n + slots"),
    ],
)
R(
    "13",
    "a new one-token request padded to 1 + k",
    [
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                        padded_num_tokens = 1 + self.num_spec_tokens",
        ),
        (
            "vllm/vllm/v1/core/sched/scheduler.py",
            "                    assert num_new_tokens == 1 + self.num_spec_tokens",
        ),
        (
            "vllm/vllm/v1/sample/rejection_sampler.py",
            "# -1 is used for padded draft token ids that should be rejected.",
        ),
        (
            "vllm/vllm/v1/worker/gpu_model_runner.py",
            "        # Clamp speculative scheduler placeholders (-1) before embedding lookup.",
        ),
    ],
    [
        ("nanoengine/core/sched/scheduler.py", "    def padded_size("),
        ("nanoengine/core/sched/scheduler.py", "            and not 0 < threshold < size"),
        ("nanoengine/core/sched/output.py", "PLACEHOLDER_TOKEN_ID = -1"),
        (
            "nanoengine/worker/model_runner.py",
            "            fed = [0 if d == PLACEHOLDER_TOKEN_ID else d for d in drafts]",
        ),
    ],
)
R(
    "13",
    "a pool below max_model_len",
    [
        ("vllm/vllm/v1/core/kv_cache_planning.py", "def check_enough_kv_cache_memory("),
        (
            "vllm/vllm/v1/core/kv_cache_planning.py",
            '            f"To serve at least one request with the model\'s max seq len "',
        ),
        ("vllm/vllm/v1/core/sched/scheduler.py", "                        preempted_req = self.running[-1]"),
    ],
    [
        ("nanoengine/core/sched/scheduler.py", "                    self.finish_length_capped(request)"),
        (
            "nanoengine/core/sched/scheduler.py",
            "        That happens only where the pool holds fewer tokens than max_model_len",
        ),
    ],
)
R(
    "13",
    "who proposes, and async scheduling",
    [
        (
            "vllm/vllm/v1/engine/core.py",
            "        if self.check_for_draft_tokens and not self.async_scheduling and model_executed:",
        ),
        (
            "vllm/vllm/v1/core/sched/async_scheduler.py",
            "        self._spec_token_placeholders: list[int] = [-1] * self.num_spec_tokens",
        ),
        (
            "vllm/vllm/v1/core/sched/async_scheduler.py",
            "            request.spec_token_ids = self._spec_token_placeholders",
        ),
    ],
    [
        ("nanoengine/engine/llm_engine.py", "    def _propose(self, output: ModelRunnerOutput) -> None:"),
        ("nanoengine/engine/llm_engine.py", "        self.scheduler.update_draft_token_ids(drafts)"),
        (
            "nanoengine/engine/arg_utils.py",
            '            unsupported = "speculative_config (the runner does not fill in draft placeholders on the device)"',
        ),
    ],
)
R(
    "13",
    "draft model",
    [
        (
            "vllm/vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py",
            "class StandaloneARSpeculator(DraftModelSpeculator):",
        ),
        ("vllm/vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py", "    num_extra_query_per_req = 1"),
        ("vllm/vllm/v1/worker/gpu/spec_decode/__init__.py", "    elif speculative_config.uses_draft_model():"),
        ("vllm/vllm/v1/spec_decode/draft_model.py", "class DraftModelProposer(SpecDecodeBaseProposer):"),
        (
            "vllm/vllm/v1/spec_decode/draft_model.py",
            "        self.use_heterogeneous_vocab = self.speculative_config.use_heterogeneous_vocab",
        ),
        ("vllm/vllm/v1/spec_decode/llm_base_proposer.py", "        self.extra_slots_per_request = ("),
        ("vllm/vllm/config/speculative.py", "    draft_sample_method:"),
        ("vllm/vllm/config/vllm.py", "    def num_lookahead_tokens(self) -> int:"),
    ],
    [
        ("nanoengine/spec_decode/draft_model.py", "class DraftModelProposer:"),
        (
            "nanoengine/worker/model_runner.py",
            "            self._draft_token_ids = self.drafter.propose(\n                self._prepare_inputs, self._draft_requests(batch, starts, done), hidden_states\n            )",
        ),
        ("nanoengine/config/scheduler.py", "    num_lookahead_tokens: int = 0"),
        ("nanoengine/config/engine.py", "follows the target's one block table."),
    ],
)
R(
    "13",
    "EAGLE",
    [
        ("vllm/vllm/v1/spec_decode/eagle.py", "class EagleProposer(SpecDecodeBaseProposer):"),
        ("vllm/vllm/model_executor/models/llama_eagle.py", "class EagleLlamaForCausalLM(_EagleLlamaForCausalLMBase):"),
        (
            "vllm/vllm/model_executor/models/llama_eagle3.py",
            "class Eagle3LlamaForCausalLM(_Eagle3LlamaForCausalLMBase):",
        ),
        ("vllm/vllm/config/speculative.py", "    def use_eagle_block_drop(self) -> bool:"),
        ("vllm/vllm/config/speculative.py", "    def needs_eagle_block_drop(self) -> bool:"),
        (
            "vllm/vllm/v1/worker/gpu/spec_decode/eagle/speculator.py",
            "class EagleSpeculator(TargetDependentARSpeculator):",
        ),
        ("vllm/vllm/config/vllm.py", "    def num_hash_lookahead_tokens(self) -> int:"),
        ("vllm/vllm/v1/core/sched/scheduler.py", "            self.use_eagle_block_drop = False"),
    ],
    [
        ("nanoengine/spec_decode/eagle.py", "class EagleProposer(DraftModelProposer):"),
        ("nanoengine/model/llama_eagle.py", "class EagleLlamaForCausalLM(nn.Module):"),
        ("nanoengine/entrypoints/llm.py", "nanoengine reads no EAGLE checkpoint"),
        (
            "nanoengine/worker/worker.py",
            '        if (\n            not (config.model_config.enforce_eager or len(groups) > 1 or config.use_eagle)\n            and self.device.type == "cuda"\n            and self.backend.supports_cuda_graphs\n        ):',
        ),
    ],
)
R(
    "13",
    "speculative decoding stats",
    [
        ("vllm/vllm/v1/spec_decode/metrics.py", "class SpecDecodingStats:"),
        (
            "vllm/vllm/v1/spec_decode/metrics.py",
            "    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int):",
        ),
        (
            "vllm/vllm/v1/spec_decode/metrics.py",
            "    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)",
        ),
    ],
    [
        ("nanoengine/engine/llm_engine.py", "    num_drafts: int = 0"),
        ("nanoengine/engine/llm_engine.py", "    def draft_acceptance_rate(self) -> float:"),
    ],
)

# 15
R(
    "15",
    "engine core in a thread, not a process",
    [
        ("vllm/vllm/v1/engine/core.py", "class EngineCoreProc(EngineCore):"),
        ("vllm/vllm/v1/engine/core.py", "    def run_busy_loop(self):"),
        ("vllm/vllm/v1/engine/core.py", "                target=self.process_input_sockets,"),
        ("vllm/vllm/v1/engine/core_client.py", "class AsyncMPClient(MPClient):"),
    ],
    [
        (
            "nanoengine/engine/async_llm.py",
            'self._executor = ThreadPoolExecutor(1, thread_name_prefix="nanoengine-step")',
        ),
        ("nanoengine/engine/async_llm.py", "finished = await loop.run_in_executor(self._executor, self.engine.step)"),
    ],
)
R(
    "15",
    "aborts between steps",
    [
        ("vllm/vllm/v1/engine/core.py", "                            self.aborts_queue.put_nowait(request)"),
        (
            "vllm/vllm/v1/engine/core.py",
            "        self._process_aborts_queue()\n        engine_core_outputs = self.scheduler.update_from_output(",
        ),
        (
            "vllm/vllm/v1/engine/core.py",
            "        self._process_aborts_queue()\n        engine_core_outputs = self.scheduler.update_from_output(",
            2,
        ),
        (
            "vllm/vllm/v1/engine/core.py",
            "            self.step if self.batch_queue is None else self.step_with_batch_queue",
        ),
        ("vllm/vllm/config/vllm.py", "            if self.use_v2_model_runner:\n                return pp_size + 1"),
    ],
    [
        ("nanoengine/engine/async_llm.py", "            self._submit(lambda: self._abort(call.engine_ids))"),
        ("nanoengine/engine/async_llm.py", "            for change in inbox:\n                change()"),
    ],
)
R(
    "15",
    "detokenizing and stop strings",
    [
        ("vllm/vllm/v1/engine/output_processor.py", "                stop_string = req_state.detokenizer.update("),
        ("vllm/vllm/v1/engine/async_llm.py", "                        if processed_outputs.reqs_to_abort:"),
    ],
    [
        (
            "nanoengine/engine/llm_engine.py",
            "stopped = [req_id for req_id in self._taken(output) if self._detokenize(req_id, now)]",
        ),
        ("nanoengine/engine/async_llm.py", "    def _publish(self, finished: list[RequestOutput]) -> IterationStats:"),
    ],
)
R(
    "15",
    "per-request output queue",
    [
        ("vllm/vllm/v1/engine/output_processor.py", "class RequestOutputCollector:"),
        ("vllm/vllm/v1/engine/output_processor.py", "            self.output.add(output, aggregate=self.aggregate)"),
    ],
    [
        (
            "nanoengine/engine/async_llm.py",
            "    queue: asyncio.Queue[RequestOutput | BaseException] = field(default_factory=asyncio.Queue)",
        ),
    ],
)
R(
    "15",
    "latency metrics",
    [
        ("vllm/vllm/v1/metrics/stats.py", "            first_token_latency = self._time_since(req_stats.arrival_time)"),
        ("vllm/vllm/v1/metrics/stats.py", "            itl = engine_core_timestamp - req_stats.last_token_ts"),
        ("vllm/vllm/v1/metrics/loggers.py", '            name="vllm:e2e_request_latency_seconds",'),
    ],
    [
        ("nanoengine/engine/async_llm.py", "                    stats.time_to_first_tokens_iter.append(now - arrival)"),
        ("nanoengine/metrics/loggers.py", '            "vllm:time_to_first_token_seconds",'),
    ],
)
