package handler

import (
	"net/http"

	"github.com/redislock/redislock/examples/gozero-service/internal/logic"
	"github.com/redislock/redislock/examples/gozero-service/internal/svc"
	"github.com/redislock/redislock/examples/gozero-service/internal/types"

	"github.com/zeromicro/go-zero/rest/httpx"
)

// ChargeHandler serves POST /invoices/:id/charge.
func ChargeHandler(svcCtx *svc.ServiceContext) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req types.ChargeReq
		if err := httpx.Parse(r, &req); err != nil {
			httpx.ErrorCtx(r.Context(), w, err)
			return
		}

		l := logic.NewChargeLogic(r.Context(), svcCtx)
		resp, err := l.Charge(&req)
		if err != nil {
			httpx.ErrorCtx(r.Context(), w, err)
		} else {
			httpx.OkJsonCtx(r.Context(), w, resp)
		}
	}
}
