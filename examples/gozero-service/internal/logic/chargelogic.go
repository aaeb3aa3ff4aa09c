package logic

import (
	"context"
	"errors"
	"net/http"

	"github.com/redislock/redislock"
	"github.com/redislock/redislock/examples/gozero-service/internal/errorx"
	"github.com/redislock/redislock/examples/gozero-service/internal/svc"
	"github.com/redislock/redislock/examples/gozero-service/internal/types"

	"github.com/zeromicro/go-zero/core/logx"
)

type ChargeLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

func NewChargeLogic(ctx context.Context, svcCtx *svc.ServiceContext) *ChargeLogic {
	return &ChargeLogic{
		Logger: logx.WithContext(ctx),
		ctx:    ctx,
		svcCtx: svcCtx,
	}
}

// Charge charges the invoice once, however many requests for it arrive at
// once, on however many replicas of the service.
//
// A service on go-zero's lock switches with one import. Where it had
//
//	import "github.com/zeromicro/go-zero/core/stores/redis"
//
//	lock := redis.NewRedisLock(l.svcCtx.Redis, "invoice:"+req.Id)
//	lock.SetExpire(10)
//	ok, err := lock.AcquireCtx(l.ctx)
//	...
//	lock.ReleaseCtx(l.ctx)
//
// it imports "github.com/redislock/redislock" and calls
// redislock.NewRedisLock(l.svcCtx.Redis, "invoice:"+req.Id) with the same
// store; SetExpire, AcquireCtx and ReleaseCtx stay as they are. The lock then
// re-enters, renews its lease while held, and tells its holder when it is
// lost. Locker.Do, used here, also waits for the lock, stops the work when
// the lock is lost, and releases it when the work returns.
func (l *ChargeLogic) Charge(req *types.ChargeReq) (*types.ChargeResp, error) {
	var resp *types.ChargeResp
	charge := func(ctx context.Context) error {
		var err error
		resp, err = l.chargeOnce(ctx, req.Id)
		return err
	}

	var err error
	if l.svcCtx.Unlocked {
		err = charge(l.ctx)
	} else {
		err = l.svcCtx.Locker.Do(l.ctx, "invoice:"+req.Id, charge)
	}
	switch {
	case err == nil:
		return resp, nil
	case resp != nil && errors.Is(err, redislock.ErrLockLost):
		// The charge was done, and recorded, before the loss was known
		// (the release found the key gone): the gateway's idempotency key
		// kept a second holder from charging again, so the answer stands.
		l.Errorf("invoice %s: %v after the charge was done", req.Id, err)
		return resp, nil
	}
	return nil, l.codeError(req.Id, err)
}

// chargeOnce charges invoice id unless its paid marker says it was. ctx ends
// if the invoice's lock is lost.
func (l *ChargeLogic) chargeOnce(ctx context.Context, id string) (*types.ChargeResp, error) {
	paidKey := "invoice:" + id + ":paid"
	paid, err := l.svcCtx.Redis.ExistsCtx(ctx, paidKey)
	if err != nil {
		return nil, err
	}
	if paid {
		return &types.ChargeResp{Invoice: id, Reason: "already paid"}, nil
	}
	// If ctx ends (the lock lost, the request gone), the gateway stops and
	// charges nothing, and neither do we.
	charged, err := l.svcCtx.Gateway.Charge(ctx, id)
	if err != nil {
		return nil, err
	}
	// The invoice is paid (by this charge, or by an earlier one the gateway
	// knew by its key): record it even if the lock was lost just now, so
	// that later requests do not go to the gateway at all.
	if err := l.svcCtx.Redis.SetCtx(context.WithoutCancel(ctx), paidKey, "1"); err != nil {
		return nil, err
	}
	if !charged {
		return &types.ChargeResp{Invoice: id, Reason: "already paid"}, nil
	}
	return &types.ChargeResp{Invoice: id, Charged: true}, nil
}

// codeError says which HTTP status answers err.
func (l *ChargeLogic) codeError(id string, err error) error {
	switch {
	case errors.Is(err, redislock.ErrLockLost):
		l.Errorf("invoice %s: %v", id, err)
		return &errorx.CodeError{Code: http.StatusConflict, Msg: "the invoice's lock was lost during the charge: retry"}
	case errors.Is(err, redislock.ErrNotAcquired), errors.Is(err, redislock.ErrLockerClosed),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &errorx.CodeError{Code: http.StatusServiceUnavailable, Msg: "the invoice is busy, or the service is stopping: retry"}
	case errors.Is(err, redislock.ErrKeyTooLong):
		return &errorx.CodeError{Code: http.StatusBadRequest, Msg: "invoice id too long"}
	default:
		l.Errorf("invoice %s: %v", id, err)
		return &errorx.CodeError{Code: http.StatusInternalServerError, Msg: "internal error"}
	}
}
