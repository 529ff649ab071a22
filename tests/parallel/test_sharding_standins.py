"""Why Paddle's sharding stages 2 and 3 do not run on a CPU build, and what alignment/parallel/cpu_standins.py changes
about it: exactly the checks named there, with Paddle's own code for everything else (tests/parallel/test_sharding.py
runs them on gloo processes against one process)."""
import paddle
import pytest
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_optimizer_stage2 as stage2_optimizer
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as stage3
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_storage as storage
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_utils import cvt_to_device

from alignment.parallel import cpu_standins

pytestmark = pytest.mark.skipif(paddle.is_compiled_with_cuda(), reason="the CPU build's checks")


def model_and_optimizer():
    model = paddle.nn.Linear(4, 4)
    return model, paddle.optimizer.AdamW(parameters=model.parameters())


def test_paddles_group_sharded_classes_stop_at_their_device_checks_on_a_cpu_build():
    from paddle.distributed.sharding import group_sharded_parallel

    model, optimizer = model_and_optimizer()
    with pytest.raises(AssertionError, match="only support gpu, xpu and custom_device"):
        group_sharded_parallel(model, optimizer, "os_g")
    with pytest.raises(AssertionError, match="Only GPU and XPU and CustomDevice is supported now"):
        stage2_optimizer.GroupShardedOptimizerStage2(params=optimizer._parameter_list, optim=optimizer, device="cpu")
    with pytest.raises(AssertionError, match="Only support CUDA / XPU / CustomDevice"):
        stage3.GroupShardedStage3(model, optimizer=optimizer, device="cpu")
    with pytest.raises(AttributeError, match="get_device_type"):  # ParamStorage.add_rank_params's copy to the
        cvt_to_device(paddle.zeros([4]), 0)  # device fails before its own OSError ("compiled with cpu")
    with pytest.raises(IndexError):  # GroupShardedOptimizerStage2's device number
        int(paddle.get_device().split(":")[1])


def test_the_stand_ins_run_paddles_own_code_and_leave_paddles_modules_alone():
    host_stage3, host_optimizer = cpu_standins._HostGroupShardedStage3, cpu_standins._HostGroupShardedOptimizerStage2
    for stand_in, paddle_class, names in ((host_stage3, stage3.GroupShardedStage3,
                                          ("__init__", "_flatten_layer_params", "_handle_unslice_params")),
                                         (host_optimizer, stage2_optimizer.GroupShardedOptimizerStage2,
                                          ("__init__", "_integration_params"))):
        assert issubclass(stand_in, paddle_class)
        for name in names:
            assert getattr(stand_in, name).__code__ is getattr(paddle_class, name).__code__
        other = {name for name in vars(stand_in) if callable(vars(stand_in)[name])} - set(names)
        assert not other, other  # no other method replaced
    assert stage3.core is paddle.framework.core and stage2_optimizer.core is paddle.framework.core
    assert stage2_optimizer.paddle is paddle and stage2_optimizer.ParamStorage is storage.ParamStorage
    assert "param2dtype" not in vars(stage3) or isinstance(vars(stage3)["param2dtype"], dict)


def test_the_cpu_group_sharded_parallel_takes_no_offload_or_scaler_and_only_stages_2_and_3():
    model, optimizer = model_and_optimizer()
    with pytest.raises(ValueError, match="no GradScaler and no offload"):
        cpu_standins.group_sharded_parallel(model, optimizer, "p_g_os", offload=True)
    with pytest.raises(ValueError, match="builds 'os_g' and 'p_g_os'"):
        cpu_standins.group_sharded_parallel(model, optimizer, "os")
