import type { IProtocolNames } from '../generated/nbckpt';
import { requestAPI } from './request';

/**
 * The names of the nbckpt protocol, as `GET nbckpt/api/protocol` returns them
 * (`nbckpt.protocol.as_json()`). The extension never spells a phase, event, status or
 * kind itself: it reads them from here. Their types are generated from the Python
 * (`python -m nbckpt.protocol.typescript`).
 */
export type IProtocol = IProtocolNames;

export type {
  IBarrierStateNames,
  IKindNames,
  IPhaseNames,
  IStatusNames
} from '../generated/nbckpt';

let cached: Promise<IProtocol> | null = null;

/**
 * Fetch the protocol's names once per page; later calls share the first answer.
 *
 * A failed fetch is not cached, so the next call tries again.
 */
export function loadProtocol(): Promise<IProtocol> {
  if (cached === null) {
    cached = requestAPI<IProtocol>('protocol', {}).catch(reason => {
      cached = null;
      throw reason;
    });
  }
  return cached;
}
